# Forwarder: downstream (un)subscriptions into the upstream diff (csrc/fb_forwarder.h).
# Part of fastbus/_core.pyx (included there).

# --------------------------------------------------------------------------
# Forwarder

cdef dict _MODES = {"dedup": FB_FWD_DEDUP, "subsume": FB_FWD_SUBSUME}

cdef int _fwd_event(Forwarder self, int op, uint64_t peer, bytes k, int kind, fb_keylist *diff) noexcept:
    cdef int rc
    _lock(self._lk)
    if op == FB_OP_SUBSCRIBE:
        rc = fb_forwarder_subscribe(self._f, peer, PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), kind, diff)
    else:
        rc = fb_forwarder_unsubscribe(self._f, peer, PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), kind, diff)
    _unlock(self._lk)
    return rc


cdef list _fwd_one(Forwarder self, int op, uint64_t peer, key, bint prefix):
    cdef bytes k = _as_bytes(key)
    cdef fb_keylist diff
    fb_keylist_init(&diff)
    try:
        rc = _fwd_event(self, op, peer, k, _kind(prefix), &diff)
        _check_held(rc, "subscribe" if op == FB_OP_SUBSCRIBE else "unsubscribe", "peer", peer, k, prefix)
        return _keylist_to_list(&diff, True, False)
    finally:
        fb_keylist_free(&diff)



cdef class Forwarder:
    """Turns downstream (un)subscriptions into the minimal upstream diff.

    ``mode="dedup"`` forwards a key on its first downstream holder and
    unforwards it on the last (ZeroMQ XPUB); ``mode="subsume"`` also leaves
    out keys covered by a forwarded prefix, subscribing them *before*
    unsubscribing the cover when it goes.  With ``cap > 0`` the upstream set
    collapses to the prefix ``b""`` (everything) above ``cap`` keys and
    expands again at ``cap_low`` (default ``cap * 3 // 4``) or fewer.

    Each call returns its diff as a list of ``(op, key, prefix)`` with ``op``
    SUBSCRIBE (1) or UNSUBSCRIBE (0), to apply upstream in order.

    ``trie``: work over that :class:`Trie` instead of a table of its own, so
    that each key is stored once (a broker's routing trie: the forwarder's
    calls are then its changes, made under its lock, and peers are its
    subscribers).  Nothing else may add to or remove from it meanwhile.
    """

    def __cinit__(self, str mode="subsume", Py_ssize_t cap=0, cap_low=None, Trie trie=None):
        if mode not in _MODES:
            raise ValueError(f"mode must be 'dedup' or 'subsume', not {mode!r}")
        if cap < 0:
            raise ValueError("cap must be >= 0 (0: no cap)")
        cdef Py_ssize_t low = (cap * 3 // 4) if cap_low is None else cap_low
        if low < 0 or low > cap:
            raise ValueError(f"cap_low must be between 0 and cap ({cap}), not {low}")
        self._lk = &self._lock
        if trie is None:
            self._f = fb_forwarder_new(<fb_forwarder_mode>_MODES[mode], <size_t>cap, <size_t>low)
        else:
            self._f = fb_forwarder_new_over(trie._t, <fb_forwarder_mode>_MODES[mode], <size_t>cap, <size_t>low)
            self._table = trie
            self._lk = &trie._lock
        if self._f is NULL:
            raise MemoryError("cannot allocate a forwarder")

    def __dealloc__(self):
        if self._f is not NULL:
            fb_forwarder_free(self._f)

    def subscribe(self, uint64_t peer, key, *, bint prefix=False) -> list:
        """A downstream peer subscribes; returns the upstream diff."""
        return _fwd_one(self, FB_OP_SUBSCRIBE, peer, key, prefix)

    def unsubscribe(self, uint64_t peer, key, *, bint prefix=False) -> list:
        """A downstream peer unsubscribes; returns the upstream diff.  Raises
        NotSubscribedError if the peer does not hold the key."""
        return _fwd_one(self, FB_OP_UNSUBSCRIBE, peer, key, prefix)

    def remove_peer(self, uint64_t peer, *, bint ops=False):
        """The peer disconnected: drop all it held; returns the upstream diff.
        ``ops=True``: the diff as one ops batch, as
        ``fastbus.protocol.encode_ops`` would encode it (None if empty),
        built without a Python object per key."""
        cdef fb_keylist diff
        cdef int rc
        fb_keylist_init(&diff)
        try:
            _lock(self._lk)
            with nogil:
                rc = fb_forwarder_remove_peer(self._f, peer, &diff)
            _unlock(self._lk)
            out = _keylist_to_ops(&diff) if ops else _keylist_to_list(&diff, True, False)
            _check(rc, "remove_peer")
            return out
        finally:
            fb_keylist_free(&diff)

    def remove_peer_parts(self, uint64_t peer, Py_ssize_t max_bytes):
        """The peer disconnected: drop all it held, yielding the upstream
        diff as ops batches (as ``remove_peer(ops=True)``'s) of about
        ``max_bytes`` of keys each, each part's keys copied and released
        after the caller took the part before: a peer leaving with many
        long keys costs one part beside its keys, not a copy of them and a
        diff as large.  Other events may come between the parts.  A part
        releases its keys longest first, so a prefix of the peer that goes
        before the peer's keys below it costs an op or two more (see
        ``fb_forwarder_remove_peer_some``).  An iteration left unfinished
        releases the rest, unsent, when the generator is closed (upstream
        then keeps keys nobody wants: it filters nothing out)."""
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, not {max_bytes}")
        cdef fb_keylist diff
        cdef int rc = 1
        try:
            while rc == 1:
                fb_keylist_init(&diff)
                try:
                    _lock(self._lk)
                    with nogil:
                        rc = fb_forwarder_remove_peer_some(self._f, peer, &diff, <size_t>max_bytes)
                    _unlock(self._lk)
                    out = _keylist_to_ops(&diff)
                    _check(rc, "remove_peer")
                finally:
                    fb_keylist_free(&diff)
                if out is not None:
                    yield out
        finally:
            if rc == 1:         # abandoned part way: the rest goes, its diff unsent
                fb_keylist_init(&diff)
                _lock(self._lk)
                with nogil:
                    fb_forwarder_remove_peer(self._f, peer, &diff)
                _unlock(self._lk)
                fb_keylist_free(&diff)

    def drop_peer(self, uint64_t peer) -> int:
        """The peer disconnected, and the whole upstream set (``snapshot``)
        goes next instead of a diff: drop all it held without building one
        (no copy of its keys).  Returns how many keys it held."""
        cdef int rc
        _lock(self._lk)
        with nogil:
            rc = fb_forwarder_drop_peer(self._f, peer)
        _unlock(self._lk)
        _check(rc, "drop_peer")
        return rc

    def apply(self, events) -> list:
        """Apply many ``(op, peer, key, prefix)`` events (op SUBSCRIBE or
        UNSUBSCRIBE) and return their combined diff.  If an event fails (or
        is malformed, or the iterable raises), the events before it stay
        applied and ForwarderError carries their diff and the failing index;
        the original error is its ``__cause__``."""
        cdef fb_keylist diff
        cdef int rc, op
        cdef uint64_t peer
        cdef bytes k
        cdef Py_ssize_t index = 0
        fb_keylist_init(&diff)
        try:
            try:
                for ev in events:
                    op_o, peer_o, key, prefix = ev
                    if op_o != FB_OP_SUBSCRIBE and op_o != FB_OP_UNSUBSCRIBE:
                        raise ValueError(f"op must be SUBSCRIBE (1) or UNSUBSCRIBE (0), not {op_o!r}")
                    op = op_o
                    peer = peer_o
                    k = _as_bytes(key)
                    rc = _fwd_event(self, op, peer, k, _kind(prefix), &diff)
                    _check_held(rc, "", "peer", peer, k, prefix)
                    index += 1
            except Exception as err:
                raise ForwarderError(f"event {index}: {err}", _keylist_to_list(&diff, True, False),
                                     index) from err
            return _keylist_to_list(&diff, True, False)
        finally:
            fb_keylist_free(&diff)

    def snapshot(self, *, bint ops=False):
        """The whole upstream set as SUBSCRIBE operations (resend it after a
        reconnect).  ``ops=True``: as one ops batch (None if empty), as
        ``remove_peer``'s."""
        cdef fb_keylist out
        fb_keylist_init(&out)
        try:
            _lock(self._lk)
            rc = fb_forwarder_snapshot(self._f, &out)
            _unlock(self._lk)
            _check(rc, "snapshot")
            return _keylist_to_ops(&out) if ops else _keylist_to_list(&out, True, False)
        finally:
            fb_keylist_free(&out)

    def peer_keys(self, uint64_t peer) -> list:
        """The keys a downstream peer holds, as ``(key, prefix, refcount)``."""
        cdef fb_keylist kl
        fb_keylist_init(&kl)
        try:
            _lock(self._lk)
            rc = fb_trie_subscriber_keys(fb_forwarder_trie(self._f), peer, &kl)
            _unlock(self._lk)
            _check(rc, "peer_keys")
            return _keylist_to_list(&kl, False, True)
        finally:
            fb_keylist_free(&kl)

    @property
    def upstream_count(self) -> int:
        """Keys upstream holds when not collapsed (dedup: distinct keys)."""
        _lock(self._lk)
        n = fb_forwarder_upstream_count(self._f)
        _unlock(self._lk)
        return n

    @property
    def collapsed(self) -> bool:
        """True while the cap has collapsed upstream to the prefix b""."""
        _lock(self._lk)
        c = fb_forwarder_collapsed(self._f)
        _unlock(self._lk)
        return c != 0

    @property
    def mode(self) -> str:
        return "subsume" if fb_forwarder_get_mode(self._f) == FB_FWD_SUBSUME else "dedup"

    def __repr__(self) -> str:
        return (f"<fastbus.Forwarder mode={self.mode} upstream={self.upstream_count}"
                f"{' collapsed' if self.collapsed else ''}>")
