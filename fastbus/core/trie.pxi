# Trie: the subscription table (csrc/fb_trie.h).
# Part of fastbus/_core.pyx (included there).

cdef array.array _u64_template = _pyarray.array('Q')


cdef int _keys_cb(void *ctx, const unsigned char *key, size_t len,
                  uint32_t exact_holders, uint32_t prefix_holders) noexcept nogil:
    cdef fb_keylist *kl = <fb_keylist *>ctx
    cdef int rc
    if exact_holders:
        rc = fb_keylist_push(kl, 0, exact_holders, key, len)
        if rc < 0:
            return rc
    if prefix_holders:
        rc = fb_keylist_push(kl, FB_KL_PREFIX, prefix_holders, key, len)
        if rc < 0:
            return rc
    return FB_WALK_NEXT


cdef class _Spans:
    """A sequence of topics pinned as C spans (the objects stay referenced)."""

    def __cinit__(self, topics):
        items = topics if type(topics) is tuple else tuple(topics)
        self.n = len(items)
        self.spans = <fb_span *>PyMem_Malloc((self.n if self.n else 1) * sizeof(fb_span))
        if self.spans is NULL:
            raise MemoryError()
        cdef list converted = None
        cdef size_t i
        cdef bytes b
        for i in range(self.n):
            o = items[i]
            if PyBytes_CheckExact(o):
                b = <bytes>o
            else:
                b = _as_bytes(o)
                if converted is None:
                    converted = []
                converted.append(b)
            self.spans[i].ptr = <const unsigned char *>PyBytes_AS_STRING(b)
            self.spans[i].len = <size_t>PyBytes_GET_SIZE(b)
        self.keep = (items, converted)

    def __dealloc__(self):
        PyMem_Free(self.spans)


# --------------------------------------------------------------------------
# Trie

cdef int _trie_match_batch(Trie self, _Spans sp, size_t *offsets, fb_idvec *v) except -1:
    cdef int rc
    _lock(&self._lock)
    if sp.n >= NOGIL_MIN_TOPICS:
        with nogil:
            rc = fb_trie_match_batch(self._t, sp.spans, sp.n, offsets, v)
    else:
        rc = fb_trie_match_batch(self._t, sp.spans, sp.n, offsets, v)
    _unlock(&self._lock)
    return _check(rc, "match")



cdef class Trie:
    """Subscription table: which subscribers want a topic.

    Keys are byte strings (``str`` is encoded as UTF-8), either *exact*
    (match the equal topic) or *prefix* (``prefix=True``: match every topic
    that starts with them; ``b""`` matches everything).  Subscribers are
    integer ids in ``0 .. 2**64 - 1``.  Each (key, kind, subscriber) is
    reference counted: adding it twice needs two removes.

    Thread-safe: every method takes the object's lock.
    """

    def __cinit__(self):
        self._t = fb_trie_new()
        if self._t is NULL:
            raise MemoryError("cannot allocate a trie")

    def __dealloc__(self):
        if self._t is not NULL:
            fb_trie_free(self._t)

    def add(self, key, uint64_t subscriber, *, bint prefix=False) -> bool:
        """Add one reference of ``subscriber`` to the key.  True if the key
        (of this kind) just got its first holder."""
        cdef bytes k = _as_bytes(key)
        cdef int rc
        _lock(&self._lock)
        rc = fb_trie_add(self._t, PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), _kind(prefix), subscriber)
        _unlock(&self._lock)
        return _check(rc, "add") == 1

    def remove(self, key, uint64_t subscriber, *, bint prefix=False) -> bool:
        """Drop one reference.  True if the key lost its last holder.
        Raises NotSubscribedError (a KeyError) if the subscriber does not
        hold the key; nothing changes then."""
        cdef bytes k = _as_bytes(key)
        cdef int rc
        _lock(&self._lock)
        rc = fb_trie_remove(self._t, PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), _kind(prefix), subscriber)
        _unlock(&self._lock)
        return _check_held(rc, "remove", "subscriber", subscriber, k, prefix) == 1

    def remove_subscriber(self, uint64_t subscriber) -> list:
        """Drop every key the subscriber holds.  Returns the ``(key, prefix)``
        pairs that lost their last holder (what a disconnect unsubscribes
        upstream).  Its cost grows with the subscriber's own keys only."""
        cdef fb_keylist gone
        cdef int rc
        fb_keylist_init(&gone)
        try:
            _lock(&self._lock)
            with nogil:
                rc = fb_trie_remove_subscriber(self._t, subscriber, &gone)
            _unlock(&self._lock)
            _check(rc, "remove_subscriber")
            return _keylist_to_list(&gone, False, False)
        finally:
            fb_keylist_free(&gone)

    def match(self, topic) -> list:
        """Subscribers with a key matching the topic, each once."""
        cdef bytes k = _as_bytes(topic)
        cdef fb_idvec v
        cdef int rc
        cdef size_t i
        fb_idvec_init(&v)
        try:
            _lock(&self._lock)
            rc = fb_trie_match(self._t, PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), &v)
            _unlock(&self._lock)
            _check(rc, "match")
            return [v.ids[i] for i in range(v.n)]
        finally:
            fb_idvec_free(&v)

    def match_many(self, topics) -> list:
        """Route many topics in one call: a list with, for each topic, the
        list of its subscribers."""
        cdef _Spans sp = _Spans(topics)
        cdef fb_idvec v
        cdef size_t *offsets = <size_t *>PyMem_Malloc((sp.n + 1) * sizeof(size_t))
        if offsets is NULL:
            raise MemoryError()
        fb_idvec_init(&v)
        cdef size_t i, j
        try:
            _trie_match_batch(self, sp, offsets, &v)
            return [[v.ids[j] for j in range(offsets[i], offsets[i + 1])] for i in range(sp.n)]
        finally:
            PyMem_Free(offsets)
            fb_idvec_free(&v)

    def match_flat(self, topics) -> tuple:
        """Route many topics in one call, without a Python object per
        subscriber: returns ``(offsets, ids)``, two ``array('Q')``; the
        subscribers of ``topics[i]`` are ``ids[offsets[i]:offsets[i+1]]``."""
        cdef _Spans sp = _Spans(topics)
        cdef fb_idvec v
        cdef array.array offs = array.clone(_u64_template, sp.n + 1, zero=False)
        fb_idvec_init(&v)
        try:
            # size_t and uint64_t have the same width on every platform fastbus builds for.
            _trie_match_batch(self, sp, <size_t *>offs.data.as_voidptr, &v)
            ids = array.clone(_u64_template, v.n, zero=False)
            if v.n:
                memcpy((<array.array>ids).data.as_voidptr, v.ids, v.n * sizeof(uint64_t))
            return offs, ids
        finally:
            fb_idvec_free(&v)

    def any_match(self, topic) -> bool:
        """Does any subscriber want this topic?"""
        cdef bytes k = _as_bytes(topic)
        _lock(&self._lock)
        rc = fb_trie_any_match(self._t, PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k))
        _unlock(&self._lock)
        return rc == 1

    def covered(self, key, *, bint prefix=False) -> bool:
        """Is the key covered by another held prefix key?"""
        cdef bytes k = _as_bytes(key)
        _lock(&self._lock)
        rc = fb_trie_covered(self._t, PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), _kind(prefix))
        _unlock(&self._lock)
        return rc == 1

    def refcount(self, key, uint64_t subscriber, *, bint prefix=False) -> int:
        """How many times the subscriber holds the key (0: not at all)."""
        cdef bytes k = _as_bytes(key)
        _lock(&self._lock)
        n = fb_trie_refcount(self._t, PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), _kind(prefix), subscriber)
        _unlock(&self._lock)
        return n

    def holders(self, key, *, bint prefix=False) -> int:
        """Number of subscribers holding the key."""
        cdef bytes k = _as_bytes(key)
        _lock(&self._lock)
        n = fb_trie_holders(self._t, PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), _kind(prefix))
        _unlock(&self._lock)
        return n

    def keys(self, prefix=b"") -> list:
        """Every held key starting with ``prefix``, in byte order, as
        ``(key, prefix, holders)`` (what to resend after a reconnect)."""
        cdef bytes p = _as_bytes(prefix)
        cdef fb_keylist kl
        cdef int rc
        cdef const char *pp = PyBytes_AS_STRING(p)
        cdef size_t plen = PyBytes_GET_SIZE(p)
        fb_keylist_init(&kl)
        try:
            _lock(&self._lock)
            with nogil:
                rc = fb_trie_walk(self._t, pp, plen, _keys_cb, &kl)
            _unlock(&self._lock)
            _check(rc, "keys")
            return _keylist_to_list(&kl, False, True)
        finally:
            fb_keylist_free(&kl)

    def subscriber_keys(self, uint64_t subscriber) -> list:
        """The keys a subscriber holds, as ``(key, prefix, refcount)``."""
        cdef fb_keylist kl
        fb_keylist_init(&kl)
        try:
            _lock(&self._lock)
            rc = fb_trie_subscriber_keys(self._t, subscriber, &kl)
            _unlock(&self._lock)
            _check(rc, "subscriber_keys")
            return _keylist_to_list(&kl, False, True)
        finally:
            fb_keylist_free(&kl)

    def stats(self) -> dict:
        """Counts and memory: keys, subscriptions, subscribers, nodes,
        bytes_live (in live allocations) and bytes_reserved (held from the
        allocator)."""
        cdef fb_trie_stats s
        _lock(&self._lock)
        fb_trie_get_stats(self._t, &s)
        _unlock(&self._lock)
        return {"keys": s.keys, "subscriptions": s.subscriptions, "subscribers": s.subscribers,
                "nodes": s.nodes, "bytes_live": s.bytes_live, "bytes_reserved": s.bytes_reserved}

    def check(self) -> None:
        """Verify the trie's internal invariants; raise FastbusError if one
        is broken (a bug: please report it)."""
        cdef const char *why = NULL
        _lock(&self._lock)
        rc = fb_trie_check(self._t, &why)
        _unlock(&self._lock)
        if rc == FB_ENOMEM:
            raise MemoryError()
        if rc != FB_OK:
            raise FastbusError("trie invariant broken: " + why.decode("ascii"))

    def __len__(self) -> int:
        cdef fb_trie_stats s
        _lock(&self._lock)
        fb_trie_get_stats(self._t, &s)
        _unlock(&self._lock)
        return s.keys

    def __repr__(self) -> str:
        s = self.stats()
        return f"<fastbus.Trie keys={s['keys']} subscribers={s['subscribers']}>"
