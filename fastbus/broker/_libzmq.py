"""The functions of the libzmq that pyzmq loaded, for the broker's C data
plane (``fastbus.broker._relay``).

pyzmq's wheels carry their own libzmq (``pyzmq.libs/libzmq-*.so`` on Linux,
``zmq/.dylibs/libzmq*.dylib`` on macOS); a socket handle is valid only in
the library instance that made it, so the relay must call exactly that one.
This finds it among the libraries the process has loaded, checks that it
reports pyzmq's libzmq version, and hands the relay the functions'
addresses.  Where that fails (an unusual build of pyzmq, another platform),
``relay()`` returns None and the broker does the same work in Python.
``FASTBUS_BROKER_RELAY=0`` turns the relay off (to compare, or to test the
Python path).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

import zmq

log = logging.getLogger("fastbus.broker")


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


def functions() -> dict | None:
    """``{name: address}`` of the relay's libzmq functions, or None."""
    from fastbus.broker._relay import FUNCTIONS
    want = zmq.zmq_version_info()
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            addresses = {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in FUNCTIONS}
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


_bound: bool | None = None


def relay(router, sock):
    """A Relay for this router and ROUTER socket, or None (see the module doc)."""
    global _bound
    if os.environ.get("FASTBUS_BROKER_RELAY", "1") == "0":
        return None
    try:
        from fastbus.broker import _relay
    except ImportError as exc:            # a build without the extension
        log.info("the broker's C data plane is not built (%s): routing in Python", exc)
        return None
    if _bound is None:
        addresses = functions()
        _bound = addresses is not None
        if _bound:
            _relay.bind(addresses)
        else:
            log.info("the libzmq that pyzmq loaded was not found: the broker routes in Python")
    return _relay.Relay(router, sock) if _bound else None
