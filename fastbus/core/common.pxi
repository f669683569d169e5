# Key lists as Python values (the object lock and argument conversion, which
# the other extensions share, are inline in common.pxd).
# Part of fastbus/_core.pyx (included there).

cdef object _keylist_to_ops(const fb_keylist *kl):
    """fb_keylist -> one ops batch (fastbus.protocol.encode_ops's encoding:
    each key with a one-byte payload of FB_VIEW_OP_* flags), or None if the
    list is empty.  Written in C without a Python object per key: a diff of
    many long keys (a client leaving with 64 MiB of subscriptions) is one
    copy, not a list of bytes and then a batch of them."""
    if kl.n == 0:
        return None
    cdef fb_outbox_limits lim
    memset(&lim, 0, sizeof(lim))
    cdef fb_outbox ob
    fb_outbox_init(&ob, &lim)
    cdef size_t i
    cdef int rc = 0
    cdef unsigned char *buf = NULL
    cdef size_t n = 0
    cdef uint8_t flags
    cdef const fb_keyent *e
    try:
        with nogil:
            for i in range(kl.n):
                e = &kl.ents[i]
                flags = ((FB_OP_F_SUBSCRIBE if e.flags & FB_KL_SUBSCRIBE else 0)
                         | (FB_OP_F_PREFIX if e.flags & FB_KL_PREFIX else 0))
                rc = fb_outbox_append(&ob, fb_keylist_key(kl, i), e.len, &flags, 1, 0)
                if rc < 0:
                    break
            if rc >= 0:
                rc = fb_outbox_take(&ob, &buf, &n)
        _check(rc, "encode ops")
        return _wrap_batch(buf, n)
    finally:
        fb_outbox_destroy(&ob)


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
