"""The functions of the libzmq that pyzmq loaded, for fastbus's native code
that calls libzmq from C: the broker's data plane (``fastbus.broker._relay``)
and the client's engine (``fastbus.client._engine``).

pyzmq's wheels carry their own libzmq (``pyzmq.libs/libzmq-*.so`` on Linux,
``zmq/.dylibs/libzmq*.dylib`` on macOS); a socket handle is valid only in
the library instance that made it, so native code must call exactly that
one.  This finds it among the libraries the process has loaded, checks that
it reports pyzmq's libzmq version, and hands over the functions' addresses.
Where that fails (an unusual build of pyzmq, another platform), neither the
broker nor a client's session starts: fastbus.errors.DataPlaneUnavailable
says why.
"""

from __future__ import annotations

import ctypes
import os
import sys

import zmq


def _loaded_paths() -> list[str]:
    """Paths of the shared libraries this process has loaded."""
    if sys.platform.startswith("linux"):
        paths = []
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].startswith("/"):
                        paths.append(parts[5].strip())
        except OSError:
            return []
        return list(dict.fromkeys(paths))
    if sys.platform == "darwin":
        try:
            dyld = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
            dyld._dyld_image_count.restype = ctypes.c_uint32
            dyld._dyld_get_image_name.restype = ctypes.c_char_p
            dyld._dyld_get_image_name.argtypes = [ctypes.c_uint32]
            return [dyld._dyld_get_image_name(i).decode() for i in range(dyld._dyld_image_count())]
        except (OSError, AttributeError):
            return []
    return []


def _candidates() -> list[str]:
    import zmq.backend.cython._zmq as backend
    loaded = _loaded_paths()
    libs = [p for p in loaded if os.path.basename(p).startswith("libzmq")]
    # A pyzmq built with libzmq inside its own extension exports it there.
    return libs + [backend.__file__]


def functions(names: tuple[str, ...]) -> dict | None:
    """``{name: address}`` of these libzmq functions, or None."""
    want = zmq.zmq_version_info()
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            addresses = {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in names}
            version = getattr(lib, "zmq_version")
        except (OSError, AttributeError):
            continue
        major, minor, patch = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
        if (major.value, minor.value, patch.value) != tuple(want) or major.value < 4:
            continue
        if all(addresses.values()):
            return addresses
    return None
