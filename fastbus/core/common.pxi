# Helpers every concern uses: the object lock, argument conversion, key lists.
# Part of fastbus/_core.pyx (included there).

cdef inline void _lock(fb_lock *l) noexcept:
    # Never wait while holding the GIL: the holder may need it to finish.
    if not fb_lock_try(l):
        with nogil:
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

cdef list _keylist_to_list(const fb_keylist *kl, bint with_op, bint with_count):
    """fb_keylist -> [(op, key, prefix)] or [(key, prefix, count)] or [(key, prefix)]."""
    cdef list out = []
    cdef size_t i
    cdef const fb_keyent *e
    for i in range(kl.n):
        e = &kl.ents[i]
        key = PyBytes_FromStringAndSize(<const char *>fb_keylist_key(kl, i), e.len)
        prefix = (e.flags & FB_KL_PREFIX) != 0
        if with_op:
            out.append((FB_OP_SUBSCRIBE if e.flags & FB_KL_SUBSCRIBE else FB_OP_UNSUBSCRIBE, key, prefix))
        elif with_count:
            out.append((key, prefix, e.count))
        else:
            out.append((key, prefix))
    return out
