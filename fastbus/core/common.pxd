# Helpers every extension over the core shares: the object lock and the one
# rule of what a message or a key may be.  Inline, so each module that
# cimports them (fastbus._core, fastbus._decoders...) compiles its own copy
# and a call costs no more than in the module that defines it.
# Included by fastbus/_core.pxd: ``from fastbus._core cimport _as_message``.
from cpython.bytes cimport PyBytes_CheckExact

from fastbus.includes.fb_common cimport FB_EXACT, FB_PREFIX
from fastbus.includes.fb_lock cimport fb_lock, fb_lock_release, fb_lock_try, fb_lock_wait


cdef inline void _lock(fb_lock *l) noexcept:
    # Never wait while holding the GIL: the holder may need it to finish.
    if not fb_lock_try(l):
        with nogil:
            fb_lock_wait(l)

cdef inline void _lock_nogil(fb_lock *l) noexcept nogil:
    # For a caller that holds no GIL (the broker's data plane): wait as it is.
    if not fb_lock_try(l):
        fb_lock_wait(l)

cdef inline void _unlock(fb_lock *l) noexcept nogil:
    fb_lock_release(l)

cdef inline bytes _as_bytes(object o):
    """bytes as is; str as UTF-8; any other buffer copied to bytes."""
    if PyBytes_CheckExact(o):
        return <bytes>o
    if isinstance(o, str):
        return (<str>o).encode("utf-8")
    if isinstance(o, bytes):
        return bytes(o)
    try:
        return bytes(memoryview(o))
    except TypeError:
        raise TypeError(f"expected bytes, str or a bytes-like object, not {type(o).__name__}") from None

cdef inline bytes _as_message(object o):
    """What publish() accepts: _as_bytes, and numbers as redis-py sends them."""
    if PyBytes_CheckExact(o):
        return <bytes>o
    if isinstance(o, (int, float)) and not isinstance(o, bool):
        return repr(o).encode()
    try:
        return _as_bytes(o)
    except TypeError:
        raise TypeError(f"expected bytes, str, a number or a bytes-like object, not {type(o).__name__}") from None

cdef inline int _kind(bint prefix) noexcept:
    return FB_PREFIX if prefix else FB_EXACT
