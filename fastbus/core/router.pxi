# Router: a broker's routing step (csrc/fb_router.h).
# Part of fastbus/_core.pyx (included there).

# --------------------------------------------------------------------------
# Router

cdef enum:
    LINKS_PER_CALL = 4096
    FULL_PER_CALL = 64


cdef list _router_links(Router self, bint only_due, uint64_t now):
    cdef uint32_t *buf = <uint32_t *>PyMem_Malloc(LINKS_PER_CALL * sizeof(uint32_t))
    cdef size_t n, i
    if buf is NULL:
        raise MemoryError()
    try:
        _lock(&self._lock)
        if only_due:
            n = fb_router_due(self._r, now, buf, LINKS_PER_CALL)
        else:
            n = fb_router_pending(self._r, buf, LINKS_PER_CALL)
        _unlock(&self._lock)
        return [buf[i] for i in range(n)]
    finally:
        PyMem_Free(buf)


cdef void _dp_hold(void *arg, uint32_t link, int held) noexcept nogil:
    # Router.dp_hold for C (dp_hold_hook): ``arg`` is the Router's _hold.
    cdef _router_hold *h = <_router_hold *>arg
    _lock_nogil(h.lock)
    fb_router_hold(h.r, link, held)
    fb_lock_release(h.lock)


cdef class Router:
    """A broker's routing step: received batches into per-link outboxes.

    Links are integers ``0 .. 2**31 - 1``, the subscriber ids of ``trie``.
    ``route(batch, source)`` validates a batch whole, matches all its topics
    in one call and appends each record to the outbox of every matching link
    except ``source`` (a message never goes back where it came from).  Then
    ``due()`` lists the links whose outbox is due and ``take(link)`` hands a
    batch over.  Outbox limits (``max_messages``, ``max_bytes``) as in
    :class:`Outbox`; decoder limits (0: none) bound what a peer may send.

    Batches form by themselves: a broker routes what one turn of reading
    brought (``receive()``, which also names the links whose outbox it
    filled, to send at once), then takes every batch that is ``due()``.
    With no linger (``max_delay=0``, the default) every outbox that holds
    records is due, so at a low rate a message leaves in the turn it
    arrived.  ``max_delay`` is an optional linger L (seconds): a link's
    outbox is then due when full, or when nothing was taken from it in the
    last L seconds (an idle link sends at once); otherwise L after its
    previous batch was taken.  Under load each link then gets at most one
    batch per L, and a lone message still leaves at once.  ``deadline_ns()``
    is when the next batch becomes due by the linger.  ``hold(link)`` makes
    a link whose connection is blocked due only when full.
    """

    def __cinit__(self, Trie trie not None, Py_ssize_t max_messages=1000, Py_ssize_t max_bytes=1 << 20,
                  max_delay=0.0, bint checksum=False, uint32_t max_topic=0, uint32_t max_payload=0,
                  uint32_t max_records=0):
        # The outbox limits' age is the router's linger (fb_router.h).
        cdef fb_outbox_limits lim = _limits(max_messages, max_bytes, max_delay, checksum)
        self._lim.max_topic = max_topic
        self._lim.max_payload = max_payload
        self._lim.max_records = max_records
        self._lim.require_checksum = 0
        self._trie = trie
        self._r = fb_router_new(&lim)
        if self._r is NULL:
            raise MemoryError("cannot allocate a router")
        self._hold.r = self._r
        self._hold.lock = &self._lock

    def __dealloc__(self):
        if self._r is not NULL:
            fb_router_free(self._r)

    @property
    def trie(self) -> Trie:
        return self._trie

    def add_link(self, uint32_t link) -> None:
        """Give a link an outbox (idempotent).  A new link is idle: its
        first batch is due at once."""
        _lock(&self._lock)
        rc = fb_router_add_link(self._r, link)
        _unlock(&self._lock)
        _check(rc, "add_link")

    def set_headers(self, uint32_t link, bint keep, bint again=False) -> None:
        """Whether a link's records keep their headers (what a new link
        does) or go to it without them (a peer that does not read them);
        ``again``: whether a block the record before had goes as a repeat
        (a peer that said it reads them; docs/BATCH_FORMAT.md)."""
        _lock(&self._lock)
        fb_router_set_headers(self._r, link, keep, again)
        _unlock(&self._lock)

    def set_notify(self, uint32_t link, bint on) -> None:
        """Whether a link's requests that reach nobody are answered at once
        with a no-responders reply (a client's; not another broker's:
        csrc/fb_router.h)."""
        _lock(&self._lock)
        fb_router_set_notify(self._r, link, on)
        _unlock(&self._lock)

    def remove_link(self, uint32_t link) -> int:
        """Drop a link's outbox; returns how many records it still held."""
        _lock(&self._lock)
        n = fb_router_remove_link(self._r, link)
        _unlock(&self._lock)
        return n

    def add_glob(self, uint32_t link, pattern) -> int:
        """Deliver to ``link`` what the Redis glob ``pattern`` matches: the
        returned id (never a link) is what the trie must hold under the
        glob's literal prefix (``trie.add(glob_prefix(pattern)[0], id,
        prefix=True)``); routing matches each topic the trie reports for it
        exactly (fb_router.h).  A link gets a message once however many of
        its keys and globs match it."""
        cdef bytes p = _as_message(pattern)
        cdef uint64_t gid = 0
        _lock(&self._lock)
        rc = fb_router_add_glob(self._r, link, PyBytes_AS_STRING(p), <size_t>PyBytes_GET_SIZE(p), &gid)
        _unlock(&self._lock)
        _check(rc, "add_glob")
        return gid

    def add_group(self, pattern=None) -> int:
        """A queue group: of its members (:meth:`group_join`), each record
        goes to one, round robin (fb_router.h).  The returned id (never a
        link nor a glob's) is what the trie must hold under the group's key
        (a glob group, ``pattern`` given, under the glob's literal prefix)."""
        cdef bytes p = None if pattern is None else _as_message(pattern)
        cdef uint64_t gid = 0
        _lock(&self._lock)
        if p is None:
            rc = fb_router_add_group(self._r, NULL, 0, &gid)
        else:
            rc = fb_router_add_group(self._r, PyBytes_AS_STRING(p), <size_t>PyBytes_GET_SIZE(p), &gid)
        _unlock(&self._lock)
        _check(rc, "add_group")
        return gid

    def remove_group(self, uint64_t group_id) -> None:
        """Forget a group (its trie entry is the caller's to remove);
        NotSubscribedError if ``group_id`` is not one."""
        _lock(&self._lock)
        rc = fb_router_remove_group(self._r, group_id)
        _unlock(&self._lock)
        _check(rc, "remove_group")

    def group_join(self, uint64_t group_id, uint32_t link) -> None:
        _lock(&self._lock)
        rc = fb_router_group_join(self._r, group_id, link)
        _unlock(&self._lock)
        _check(rc, "group_join")

    def group_leave(self, uint64_t group_id, uint32_t link) -> None:
        """NotSubscribedError if ``link`` is not a member."""
        _lock(&self._lock)
        rc = fb_router_group_leave(self._r, group_id, link)
        _unlock(&self._lock)
        _check(rc, "group_leave")

    def group_size(self, uint64_t group_id) -> int:
        _lock(&self._lock)
        n = fb_router_group_size(self._r, group_id)
        _unlock(&self._lock)
        return n

    def set_away(self, uint32_t link, bint away) -> None:
        """A member whose session lingers without a connection: a group
        picks it only when every other member is away too."""
        _lock(&self._lock)
        fb_router_set_away(self._r, link, away)
        _unlock(&self._lock)

    # -- held groups (csrc/fb_router.h): a backlog while no member is there --

    def group_hold(self, uint64_t group_id) -> None:
        """Make a group held (idempotent): a record no member can take is
        kept for one to come, within the sender's ``:hold`` capacity and
        :meth:`set_held_limit`."""
        _lock(&self._lock)
        rc = fb_router_group_hold(self._r, group_id)
        _unlock(&self._lock)
        _check(rc, "group_hold")

    def group_release(self, uint64_t group_id) -> int:
        """The group is no longer held: what it kept is dropped (how many)."""
        _lock(&self._lock)
        n = fb_router_group_release(self._r, group_id)
        _unlock(&self._lock)
        return n

    def set_held_limit(self, size_t max_bytes) -> None:
        """What every held group's backlog may cost together (0: no bound)."""
        _lock(&self._lock)
        fb_router_set_held_limit(self._r, max_bytes)
        _unlock(&self._lock)

    def group_held(self, uint64_t group_id) -> int:
        """Records the group keeps now."""
        _lock(&self._lock)
        n = fb_router_group_held(self._r, group_id)
        _unlock(&self._lock)
        return n

    @property
    def held_bytes(self) -> int:
        """What every backlog costs now."""
        _lock(&self._lock)
        n = fb_router_held_bytes(self._r)
        _unlock(&self._lock)
        return n

    def group_give(self, uint64_t group_id, now_ns=None) -> tuple:
        """The group's backlog to its members, oldest first: how many were
        given, and the links whose outbox that filled (take their batches),
        or None."""
        cdef uint64_t now = _now(now_ns)
        cdef int64_t rc
        cdef uint32_t full[FULL_PER_CALL]
        cdef size_t nfull = 0, i
        _lock(&self._lock)
        with nogil:
            rc = fb_router_group_give(self._r, group_id, now)
            if rc >= 0:
                nfull = fb_router_full(self._r, full, FULL_PER_CALL)
        _unlock(&self._lock)
        if rc < 0:
            _check(<int>rc, "group_give")
        return rc, ([full[i] for i in range(nfull)] if nfull else None)

    def group_expire(self, uint64_t group_id, uint64_t before_ns) -> int:
        """Drop what the group kept before ``before_ns``: how many."""
        _lock(&self._lock)
        n = fb_router_group_expire(self._r, group_id, before_ns)
        _unlock(&self._lock)
        return n

    def group_restore(self, uint64_t group_id, bytes topic not None, bytes headers not None, bytes payload not None,
                      uint64_t at_ns) -> bool:
        """Put a record back into a held group's backlog, the newest, kept
        at ``at_ns`` (a journal read back): nobody is given it now.  False
        past :meth:`set_held_limit` (not kept)."""
        cdef fb_record rec
        cdef int rc
        rec.topic = <const unsigned char *>PyBytes_AS_STRING(topic)
        rec.topic_len = <uint32_t>PyBytes_GET_SIZE(topic)
        rec.headers = <const unsigned char *>PyBytes_AS_STRING(headers) if headers else NULL
        rec.headers_len = <uint32_t>PyBytes_GET_SIZE(headers)
        rec.payload = <const unsigned char *>PyBytes_AS_STRING(payload)
        rec.payload_len = <uint32_t>PyBytes_GET_SIZE(payload)
        _lock(&self._lock)
        rc = fb_router_group_restore(self._r, group_id, &rec, at_ns)
        _unlock(&self._lock)
        if rc == FB_ETOOBIG:
            return False
        _check(rc, "group_restore")
        return True

    def set_group_topic(self, uint64_t group_id, bytes topic, uint32_t capacity=0) -> None:
        """What the group takes from the channels it is bound to (its id
        held in the trie under them) goes as published on ``topic``, its
        own channel; of those, its backlog keeps at most ``capacity`` (0:
        no count bound).  None: records keep their topics (csrc/fb_router.h,
        "Bound channels")."""
        _lock(&self._lock)
        if topic is None:
            rc = fb_router_set_group_topic(self._r, group_id, NULL, 0, 0)
        else:
            rc = fb_router_set_group_topic(self._r, group_id, PyBytes_AS_STRING(topic),
                                           <size_t>PyBytes_GET_SIZE(topic), capacity)
        _unlock(&self._lock)
        _check(rc, "set_group_topic")

    def set_group_mark(self, uint64_t group_id, bytes mark not None) -> None:
        """The group's name in every broker of a federation (1 to 32 bytes):
        what a record's ``:groups`` header says when this broker gives the
        record to another broker for it to pick a member (csrc/fb_router.h,
        "Queue groups across brokers")."""
        _lock(&self._lock)
        rc = fb_router_set_group_mark(self._r, group_id, PyBytes_AS_STRING(mark), <size_t>PyBytes_GET_SIZE(mark))
        _unlock(&self._lock)
        _check(rc, "set_group_mark")

    def set_broker(self, uint32_t link, bint broker) -> None:
        """A link to another broker: the queue groups of the records that
        come from it were picked for there (but those its ``:groups``
        names); as a group's member it stands for the members behind it."""
        _lock(&self._lock)
        fb_router_set_broker(self._r, link, broker)
        _unlock(&self._lock)

    def remove_glob(self, uint64_t glob_id) -> None:
        """Forget a glob of :meth:`add_glob` (its trie entry is the caller's
        to remove); NotSubscribedError if ``glob_id`` is not one."""
        _lock(&self._lock)
        rc = fb_router_remove_glob(self._r, glob_id)
        _unlock(&self._lock)
        if rc == FB_ENOTFOUND:
            raise NotSubscribedError(f"{glob_id} is not a glob of this router")
        _check(rc, "remove_glob")

    @property
    def globs(self) -> int:
        """Glob subscriptions held."""
        return fb_router_glob_count(self._r)

    def has_link(self, uint32_t link) -> bool:
        _lock(&self._lock)
        n = fb_router_has_link(self._r, link)
        _unlock(&self._lock)
        return n != 0

    def route(self, batch, source=None, now_ns=None) -> int:
        """Route one received batch; returns its record count.  Raises
        BatchError (nothing routed) for a malformed batch or one over the
        decoder limits."""
        cdef Py_buffer view
        cdef uint64_t src = UINT64_MAX if source is None else <uint64_t>source
        cdef uint64_t now = _now(now_ns)
        cdef int rc
        PyObject_GetBuffer(batch, &view, PyBUF_SIMPLE)
        try:
            _lock(&self._lock)
            _lock(&self._trie._lock)
            with nogil:
                rc = fb_router_route(self._r, self._trie._t, view.buf, <size_t>view.len, &self._lim, src, now)
            _unlock(&self._trie._lock)
            _unlock(&self._lock)
        finally:
            PyBuffer_Release(&view)
        return _check(rc, "route")

    def receive(self, batch, source=None, now_ns=None):
        """Route one received batch, as ``route()`` (BatchError likewise),
        and return the links whose outbox is full (``max_messages`` or
        ``max_bytes``) and took records from it (each once, up to 64; any
        others in the next call, and ``due()`` lists them too), or None.  Take those batches before
        reading on, so that a flood never grows an outbox past its limits.
        The broker's one call per received batch."""
        cdef Py_buffer view
        cdef uint64_t src = UINT64_MAX if source is None else <uint64_t>source
        cdef uint64_t now = _now(now_ns)
        cdef int rc
        cdef uint32_t full[FULL_PER_CALL]
        cdef size_t n = 0, i
        PyObject_GetBuffer(batch, &view, PyBUF_SIMPLE)
        try:
            _lock(&self._lock)
            _lock(&self._trie._lock)
            with nogil:
                rc = fb_router_route(self._r, self._trie._t, view.buf, <size_t>view.len, &self._lim, src, now)
                if rc >= 0:
                    n = fb_router_full(self._r, full, FULL_PER_CALL)
            _unlock(&self._trie._lock)
            _unlock(&self._lock)
        finally:
            PyBuffer_Release(&view)
        _check(rc, "route")
        if n == 0:
            return None
        return [full[i] for i in range(n)]

    def route_to_groups(self, bytes batch not None, size_t skip, list group_ids not None, uint32_t source,
                        now_ns=None) -> tuple:
        """The records of ``batch`` from the ``skip``-th on, to the queue
        groups ``group_ids`` only (one member each, never ``source``): what
        a member that ran out was given and never took, to another.
        Returns how many a member took (csrc/fb_router.h), and the links
        whose outbox that filled (as ``receive``: take their batches
        before handing over more), or None."""
        cdef uint64_t now = _now(now_ns)
        cdef int64_t rc
        cdef uint32_t full[FULL_PER_CALL]
        cdef size_t nfull = 0
        cdef size_t n = len(group_ids), i
        cdef const char *data = PyBytes_AS_STRING(batch)
        cdef size_t size = <size_t>PyBytes_GET_SIZE(batch)
        cdef uint64_t *ids = <uint64_t *>malloc((n if n else 1) * sizeof(uint64_t))
        if ids is NULL:
            raise MemoryError()
        try:
            for i in range(n):
                ids[i] = group_ids[i]
            _lock(&self._lock)
            _lock(&self._trie._lock)
            with nogil:
                rc = fb_router_route_groups(self._r, self._trie._t, data, size, skip, ids, n, source, now)
                if rc >= 0:
                    nfull = fb_router_full(self._r, full, FULL_PER_CALL)
            _unlock(&self._trie._lock)
            _unlock(&self._lock)
        finally:
            free(ids)
        if rc < 0:
            _check(<int>rc, "route_to_groups")
        return rc, ([full[i] for i in range(nfull)] if nfull else None)

    def due(self, now_ns=None) -> list:
        """Links whose outbox is due now (full, or by the linger rule; with
        no linger every link whose outbox holds records), up to 4096 per
        call: take their batches, then call again for more."""
        return _router_links(self, True, _now(now_ns))

    def pending(self) -> list:
        """Links whose outbox holds records, due or not (up to 4096 per call)."""
        return _router_links(self, False, 0)

    def take(self, uint32_t link, now_ns=None):
        """Hand over a link's pending batch (a Batch), or None; records the
        time (now, or ``now_ns``) as the link's last batch, for the linger."""
        cdef unsigned char *buf = NULL
        cdef size_t n = 0
        cdef uint64_t now = _now(now_ns)
        _lock(&self._lock)
        rc = fb_router_take(self._r, link, now, &buf, &n)
        _unlock(&self._lock)
        _check(rc, "take")
        return None if buf is NULL else _wrap_batch(buf, n)

    def hold(self, uint32_t link, bint held=True) -> None:
        """Hold a link whose connection cannot take more (its outbox is due
        only when full: what arrives meanwhile forms its next batch), or
        release it (``held=False``)."""
        _lock(&self._lock)
        fb_router_hold(self._r, link, held)
        _unlock(&self._lock)

    def set_catchall(self, link, from_ns=0) -> None:
        """From monotonic time ``from_ns`` on (0: now), ``link`` receives
        every record routed, as if subscribed to everything (each once,
        never its own); None: no such link.  A broker's upstream link, whose
        view of what upstream wants may be stale once its lease ran out
        (csrc/fb_router.h)."""
        cdef uint32_t l = UINT32_MAX if link is None else <uint32_t>link
        cdef uint64_t f = <uint64_t>from_ns
        _lock(&self._lock)
        fb_router_set_catchall(self._r, l, f)
        _unlock(&self._lock)

    def append(self, uint32_t link, topic, payload, now_ns=None, *, headers=None) -> bool:
        """Append one record (and its headers, a mapping, if any) to a
        link's outbox directly; True when full.  KeyError if the link has
        no outbox."""
        cdef bytes t = _as_bytes(topic)
        cdef bytes p = _as_bytes(payload)
        cdef bytes h = _encode_headers(headers)
        cdef uint64_t now = _now(now_ns)
        cdef fb_outbox *ob
        cdef int rc
        _lock(&self._lock)
        ob = fb_router_outbox(self._r, link)
        if ob is NULL:
            _unlock(&self._lock)
            raise KeyError(f"no link {link}")
        rc = _append(ob, t, h, p, now)
        if rc >= 0:
            fb_router_touch(self._r, link)
        _unlock(&self._lock)
        return _check(rc, "append") == 1

    def queued(self, uint32_t link) -> tuple:
        """(records, bytes) pending in a link's outbox."""
        cdef fb_outbox *ob
        cdef size_t count = 0, nbytes = 0
        _lock(&self._lock)
        ob = fb_router_outbox(self._r, link)
        if ob is not NULL:
            count = fb_outbox_count(ob)
            nbytes = fb_outbox_bytes(ob)
        _unlock(&self._lock)
        return count, nbytes

    def deadline_ns(self):
        """When the next outbox becomes due by the linger (monotonic ns; at
        or before now if one is due now), or None: nothing will be."""
        _lock(&self._lock)
        d = fb_router_deadline(self._r)
        _unlock(&self._lock)
        return None if d == UINT64_MAX else d

    @property
    def oversize(self) -> int:
        """Records not routed for being over max_topic/max_payload (cumulative;
        their batches' other records were routed)."""
        cdef fb_router_stats s
        _lock(&self._lock)
        fb_router_get_stats(self._r, &s)
        _unlock(&self._lock)
        return s.oversize

    def stats(self) -> dict:
        """batches, records, bytes, deliveries, unrouted, rejected, oversize,
        no_responders, group_orphaned, held_kept, held_given, held_full,
        held_dropped (cumulative)."""
        cdef fb_router_stats s
        _lock(&self._lock)
        fb_router_get_stats(self._r, &s)
        _unlock(&self._lock)
        return {"batches": s.batches, "records": s.records, "bytes": s.bytes,
                "deliveries": s.deliveries, "unrouted": s.unrouted, "rejected": s.rejected,
                "oversize": s.oversize, "no_responders": s.no_responders, "group_orphaned": s.group_orphaned,
                "held_kept": s.held_kept, "held_given": s.held_given, "held_full": s.held_full,
                "held_dropped": s.held_dropped}

    # -- the data plane's calls (see core/router.pxd) ---------------------

    cdef int dp_route(self, uint32_t link, const void *data, size_t len, uint64_t now, uint32_t *full,
                      size_t cap, size_t *nfull, uint64_t *oversize, uint64_t *deliveries) noexcept nogil:
        cdef fb_router_stats st
        cdef uint64_t over0, del0
        cdef int rc
        _lock_nogil(&self._lock)
        _lock_nogil(&self._trie._lock)
        fb_router_get_stats(self._r, &st)
        over0, del0 = st.oversize, st.deliveries
        rc = fb_router_route(self._r, self._trie._t, data, len, &self._lim, link, now)
        nfull[0] = 0
        oversize[0] = deliveries[0] = 0
        if rc >= 0:
            nfull[0] = fb_router_full(self._r, full, cap)
            fb_router_get_stats(self._r, &st)
            oversize[0] = st.oversize - over0
            deliveries[0] = st.deliveries - del0
        fb_lock_release(&self._trie._lock)
        fb_lock_release(&self._lock)
        return rc

    cdef size_t dp_pending(self, uint32_t *links, size_t cap) noexcept nogil:
        cdef size_t n
        _lock_nogil(&self._lock)
        n = fb_router_pending(self._r, links, cap)
        fb_lock_release(&self._lock)
        return n

    cdef size_t dp_due(self, uint64_t now, uint32_t *links, size_t cap) noexcept nogil:
        cdef size_t n
        _lock_nogil(&self._lock)
        n = fb_router_due(self._r, now, links, cap)
        fb_lock_release(&self._lock)
        return n

    cdef int dp_take(self, uint32_t link, uint64_t now, unsigned char **buf, size_t *len) noexcept nogil:
        cdef int rc
        _lock_nogil(&self._lock)
        rc = fb_router_take(self._r, link, now, buf, len)
        fb_lock_release(&self._lock)
        return rc

    cdef uint64_t dp_deadline(self) noexcept nogil:
        cdef uint64_t due
        _lock_nogil(&self._lock)
        due = fb_router_deadline(self._r)
        fb_lock_release(&self._lock)
        return due

    cdef void dp_hold(self, uint32_t link, int held) noexcept nogil:
        _lock_nogil(&self._lock)
        fb_router_hold(self._r, link, held)
        fb_lock_release(&self._lock)

    cdef void dp_hold_hook(self, _hold_fn *fn, void **arg) noexcept nogil:
        fn[0] = _dp_hold
        arg[0] = &self._hold

    cdef void dp_set_held_hook(self, fb_router_held_fn fn, void *arg) noexcept nogil:
        _lock_nogil(&self._lock)
        fb_router_set_held_hook(self._r, fn, arg)
        fb_lock_release(&self._lock)

    cdef const fb_backlog *dp_lock_backlog(self, uint64_t gid) noexcept nogil:
        _lock_nogil(&self._lock)
        return fb_router_group_backlog(self._r, gid)

    cdef void dp_unlock(self) noexcept nogil:
        fb_lock_release(&self._lock)
