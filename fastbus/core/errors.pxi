# Errors: the one place where C status codes become exceptions.
# Part of fastbus/_core.pyx (included there).

cdef dict _BATCH_REASONS = {
    FB_EMALFORMED: "malformed", FB_ETRUNCATED: "truncated", FB_EVERSION: "version",
    FB_ELIMIT: "limit", FB_ECHECKSUM: "checksum",
}

cdef object _error(int rc, str what="", int err=0):
    """The exception for a C status code (err: the errno of FB_EIO)."""
    msg = fb_strerror(rc).decode("ascii")
    if what and not msg.endswith(what):      # not "batch: malformed batch"
        msg = f"{what}: {msg}"
    if rc == FB_ENOMEM:
        return MemoryError(msg)
    if rc == FB_ENOTFOUND:
        return NotSubscribedError(msg)
    if rc == FB_EOVERFLOW:
        return OverflowError(msg)
    if rc in _BATCH_REASONS:
        return BatchError(msg, _BATCH_REASONS[rc])
    if rc == FB_EINVAL or rc == FB_ETOOBIG:
        return ValueError(msg)
    if rc == FB_ETIMEOUT:
        return TimeoutError(msg)
    if rc == FB_ECLOSED:
        return ConnectionResetError(msg)
    if rc == FB_EIO:
        return OSError(err, f"{msg}: {os.strerror(err)}")
    return FastbusError(msg)

cdef int _raise(int rc, str what="", int err=0) except -1:
    raise _error(rc, what, err)

cdef int _check_held(int rc, str what, str holder, uint64_t who, bytes key, bint prefix) except -1:
    """_check for a call on a key someone holds: FB_ENOTFOUND says which
    holder ("subscriber 7", "peer 3") does not hold which key."""
    if rc == FB_ENOTFOUND:
        raise NotSubscribedError(f"{holder} {who} does not hold {'prefix' if prefix else 'exact'} key {key!r}")
    return _check(rc, what)


def error_for(int rc, str what="") -> Exception:
    """The exception for a core status code (for code that calls the C
    API itself, e.g. the broker's C data plane, and hands errors back)."""
    return _error(rc, what)
