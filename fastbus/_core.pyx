# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Python bindings of the fastbus C core (csrc/): Trie, Forwarder, Outbox, Batch.

Thin by design: each method converts arguments, takes the object's lock,
calls C, and converts the result.  The GIL is released around C work whose
cost grows with its input (batch matches, subscriber removal, decoding);
single-key operations take well under a microsecond and keep it.  C status
codes become exceptions in one place, ``_raise``.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_CheckExact, PyBytes_FromStringAndSize
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBuffer_FillInfo, PyBUF_SIMPLE
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM

from cpython.dict cimport PyDict_New, PyDict_SetItem, PyDict_GetItem
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.object cimport PyObject

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)
from fastbus.includes.fb_lock cimport fb_lock, fb_lock_try, fb_lock_release, fb_lock_wait
from cpython cimport array
from libc.stdint cimport uint8_t, int32_t, uint32_t, uint64_t, int64_t, UINT64_MAX, UINT32_MAX
from libc.stdlib cimport malloc
from libc.string cimport memcpy, memcmp, memset
from libc.errno cimport errno

from fastbus.includes.fb_common cimport *
from fastbus.includes.fb_trie cimport *
from fastbus.includes.fb_forwarder cimport *
from fastbus.includes.fb_batch cimport *
from fastbus.includes.fb_outbox cimport *
from fastbus.includes.fb_router cimport *
from fastbus.includes.fb_resp cimport *

import array as _pyarray
import os
import threading
import time
from collections import deque

from fastbus.errors import BatchError, FastbusError, ForwarderError, NotSubscribedError, PublishTimeout

EXACT = FB_EXACT
PREFIX = FB_PREFIX
SUBSCRIBE = FB_OP_SUBSCRIBE
UNSUBSCRIBE = FB_OP_UNSUBSCRIBE
BATCH_VERSION = FB_BATCH_VERSION
CORE_VERSION = (FB_VERSION_MAJOR, FB_VERSION_MINOR, FB_VERSION_PATCH)

# Release the GIL for batches at least this large; below it, the release and
# re-acquire cost more than the work.
cdef enum:
    NOGIL_MIN_TOPICS = 64
    NOGIL_MIN_BYTES = 65536

cdef array.array _u64_template = _pyarray.array('Q')

# --------------------------------------------------------------------------
# Errors: the one place where C status codes become exceptions.

cdef dict _BATCH_REASONS = {
    FB_EMALFORMED: "malformed", FB_ETRUNCATED: "truncated", FB_EVERSION: "version",
    FB_ELIMIT: "limit", FB_ECHECKSUM: "checksum",
}

cdef object _error(int rc, str what="", int err=0):
    """The exception for a C status code (err: the errno of FB_EIO)."""
    msg = fb_strerror(rc).decode("ascii")
    if what:
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

cdef int _raise(int rc, str what="") except -1:
    raise _error(rc, what)

cdef inline int _check(int rc, str what="") except -1:
    if rc < 0:
        _raise(rc, what)
    return rc

# --------------------------------------------------------------------------
# Helpers

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
    cdef fb_span *spans
    cdef size_t n
    cdef object keep

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
        if rc == FB_ENOTFOUND:
            raise NotSubscribedError(
                f"subscriber {subscriber} does not hold {'prefix' if prefix else 'exact'} key {k!r}")
        return _check(rc, "remove") == 1

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


# --------------------------------------------------------------------------
# Forwarder

cdef dict _MODES = {"dedup": FB_FWD_DEDUP, "subsume": FB_FWD_SUBSUME}

cdef int _fwd_event(Forwarder self, int op, uint64_t peer, bytes k, int kind, fb_keylist *diff) noexcept:
    cdef int rc
    _lock(&self._lock)
    if op == FB_OP_SUBSCRIBE:
        rc = fb_fwd_subscribe(self._f, peer, PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), kind, diff)
    else:
        rc = fb_fwd_unsubscribe(self._f, peer, PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k), kind, diff)
    _unlock(&self._lock)
    return rc


cdef list _fwd_one(Forwarder self, int op, uint64_t peer, key, bint prefix):
    cdef bytes k = _as_bytes(key)
    cdef fb_keylist diff
    fb_keylist_init(&diff)
    try:
        rc = _fwd_event(self, op, peer, k, _kind(prefix), &diff)
        if rc == FB_ENOTFOUND:
            raise NotSubscribedError(
                f"peer {peer} does not hold {'prefix' if prefix else 'exact'} key {k!r}")
        _check(rc, "subscribe" if op == FB_OP_SUBSCRIBE else "unsubscribe")
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
    """

    def __cinit__(self, str mode="subsume", Py_ssize_t cap=0, cap_low=None):
        if mode not in _MODES:
            raise ValueError(f"mode must be 'dedup' or 'subsume', not {mode!r}")
        if cap < 0:
            raise ValueError("cap must be >= 0 (0: no cap)")
        cdef Py_ssize_t low = (cap * 3 // 4) if cap_low is None else cap_low
        if low < 0 or low > cap:
            raise ValueError(f"cap_low must be between 0 and cap ({cap}), not {low}")
        self._f = fb_fwd_new(<fb_fwd_mode>_MODES[mode], <size_t>cap, <size_t>low)
        if self._f is NULL:
            raise MemoryError("cannot allocate a forwarder")

    def __dealloc__(self):
        if self._f is not NULL:
            fb_fwd_free(self._f)

    def subscribe(self, uint64_t peer, key, *, bint prefix=False) -> list:
        """A downstream peer subscribes; returns the upstream diff."""
        return _fwd_one(self, FB_OP_SUBSCRIBE, peer, key, prefix)

    def unsubscribe(self, uint64_t peer, key, *, bint prefix=False) -> list:
        """A downstream peer unsubscribes; returns the upstream diff.  Raises
        NotSubscribedError if the peer does not hold the key."""
        return _fwd_one(self, FB_OP_UNSUBSCRIBE, peer, key, prefix)

    def remove_peer(self, uint64_t peer) -> list:
        """The peer disconnected: drop all it held; returns the upstream diff."""
        cdef fb_keylist diff
        cdef int rc
        fb_keylist_init(&diff)
        try:
            _lock(&self._lock)
            with nogil:
                rc = fb_fwd_remove_peer(self._f, peer, &diff)
            _unlock(&self._lock)
            out = _keylist_to_list(&diff, True, False)
            _check(rc, "remove_peer")
            return out
        finally:
            fb_keylist_free(&diff)

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
                    if rc == FB_ENOTFOUND:
                        raise NotSubscribedError(
                            f"peer {peer} does not hold {'prefix' if prefix else 'exact'} key {k!r}")
                    _check(rc)
                    index += 1
            except Exception as err:
                raise ForwarderError(f"event {index}: {err}", _keylist_to_list(&diff, True, False),
                                     index) from err
            return _keylist_to_list(&diff, True, False)
        finally:
            fb_keylist_free(&diff)

    def snapshot(self) -> list:
        """The whole upstream set as SUBSCRIBE operations (resend it after a
        reconnect)."""
        cdef fb_keylist out
        fb_keylist_init(&out)
        try:
            _lock(&self._lock)
            rc = fb_fwd_snapshot(self._f, &out)
            _unlock(&self._lock)
            _check(rc, "snapshot")
            return _keylist_to_list(&out, True, False)
        finally:
            fb_keylist_free(&out)

    def peer_keys(self, uint64_t peer) -> list:
        """The keys a downstream peer holds, as ``(key, prefix, refcount)``."""
        cdef fb_keylist kl
        fb_keylist_init(&kl)
        try:
            _lock(&self._lock)
            rc = fb_trie_subscriber_keys(fb_fwd_trie(self._f), peer, &kl)
            _unlock(&self._lock)
            _check(rc, "peer_keys")
            return _keylist_to_list(&kl, False, True)
        finally:
            fb_keylist_free(&kl)

    @property
    def upstream_count(self) -> int:
        """Keys upstream holds when not collapsed (dedup: distinct keys)."""
        _lock(&self._lock)
        n = fb_fwd_upstream_count(self._f)
        _unlock(&self._lock)
        return n

    @property
    def collapsed(self) -> bool:
        """True while the cap has collapsed upstream to the prefix b""."""
        _lock(&self._lock)
        c = fb_fwd_collapsed(self._f)
        _unlock(&self._lock)
        return c != 0

    @property
    def mode(self) -> str:
        return "subsume" if fb_fwd_get_mode(self._f) == FB_FWD_SUBSUME else "dedup"

    def __repr__(self) -> str:
        return (f"<fastbus.Forwarder mode={self.mode} upstream={self.upstream_count}"
                f"{' collapsed' if self.collapsed else ''}>")


# --------------------------------------------------------------------------
# Batches and outboxes

cdef class Batch:
    """An encoded batch handed over by an Outbox, without a copy.

    Supports the buffer protocol (``memoryview(batch)``, ``sock.send(batch)``,
    ``zmq`` with ``copy=False``), ``len()`` in bytes, ``bytes()`` and
    ``records()``.  Create batches with ``Outbox.take()`` or ``encode()``.
    """

    def __cinit__(self):
        self._buf = NULL
        self._len = 0
        self._exports = 0

    def __init__(self):
        if self._buf is NULL:
            raise TypeError("Batch objects come from Outbox.take() or fastbus.encode()")

    def __dealloc__(self):
        fb_free(self._buf)

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, self._buf, <Py_ssize_t>self._len, 1, flags)
        self._exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        self._exports -= 1

    def __len__(self) -> int:
        return <Py_ssize_t>self._len

    def __bytes__(self) -> bytes:
        return PyBytes_FromStringAndSize(<const char *>self._buf, <Py_ssize_t>self._len)

    @property
    def count(self) -> int:
        """Number of records."""
        cdef uint32_t n = 0
        _check(fb_batch_header(self._buf, self._len, &n, NULL), "batch")
        return n

    def records(self) -> list:
        """Decode: ``[(topic, payload), ...]`` as bytes."""
        return decode(self)

    def __repr__(self) -> str:
        return f"<fastbus.Batch records={self.count} bytes={self._len}>"


cdef Batch _wrap_batch(unsigned char *buf, size_t n):
    cdef Batch b = Batch.__new__(Batch)
    b._buf = buf
    b._len = n
    return b


cdef inline uint64_t _now(now_ns) except? 0:
    return fb_now_ns() if now_ns is None else <uint64_t>now_ns


cdef fb_outbox_limits _limits(Py_ssize_t max_messages, Py_ssize_t max_bytes, max_delay,
                              bint checksum) except *:
    """Validated outbox limits (shared by Outbox and Router)."""
    if max_messages < 0 or max_bytes < 0:
        raise ValueError("max_messages and max_bytes must be >= 0 (0: no limit)")
    cdef double delay = 0.0 if max_delay is None else max_delay
    if not (delay >= 0.0) or delay > 1e9:
        raise ValueError(f"max_delay must be seconds >= 0 (0 or None: no limit), not {max_delay!r}")
    cdef fb_outbox_limits lim
    lim.max_messages = <size_t>max_messages
    lim.max_bytes = <size_t>max_bytes
    lim.max_age_ns = <uint64_t>(delay * 1e9)
    if delay > 0 and lim.max_age_ns == 0:
        lim.max_age_ns = 1
    lim.checksum = checksum
    return lim


cdef class Outbox:
    """A batch buffer for one destination, with a flush policy.

    ``append`` encodes a (topic, payload) record straight into the pending
    batch and returns True when a flush is due by count (``max_messages``) or
    size (``max_bytes``); ``due()`` also checks the age of the oldest record
    (``max_delay`` seconds).  ``take()`` hands the batch over as a
    :class:`Batch` without copying.  0 (or None for ``max_delay``) disables a
    limit.  Nothing is ever dropped: a record larger than ``max_bytes`` just
    makes the batch due at once.

    Times are ``time.monotonic_ns()`` values; pass ``now_ns`` to use your own
    clock (tests, simulations).
    """

    def __cinit__(self, Py_ssize_t max_messages=1000, Py_ssize_t max_bytes=1 << 20,
                  max_delay=0.005, bint checksum=False, str command=None):
        cdef fb_outbox_limits lim = _limits(max_messages, max_bytes, max_delay, checksum)
        cdef bytes verb
        if command is None:
            fb_outbox_init(&self._o, &lim)
            return
        # RESP mode: each record is the Redis command `command topic payload`
        # and a batch is a pipeline to write as is (see fb_outbox.h).
        verb = command.encode("ascii", "replace")
        if fb_outbox_init_resp(&self._o, &lim, verb) < 0:
            raise ValueError(f"not a Redis command name: {command!r} (letters, digits, '.', '_', '-'; "
                             f"at most {FB_OUTBOX_VERB_MAX} characters)")

    def __dealloc__(self):
        fb_outbox_destroy(&self._o)

    def append(self, topic, payload, now_ns=None) -> bool:
        """Add one record; True when a flush is due by count or size."""
        cdef bytes t = _as_bytes(topic)
        cdef bytes p = _as_bytes(payload)
        cdef uint64_t now = _now(now_ns)
        cdef int rc
        _lock(&self._lock)
        rc = fb_outbox_append(&self._o, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t),
                              PyBytes_AS_STRING(p), PyBytes_GET_SIZE(p), now)
        _unlock(&self._lock)
        return _check(rc, "append") == 1

    @property
    def accepted(self) -> int:
        """Records a Publisher appended (its publish() calls that queued)."""
        return self._accepted

    @property
    def refused(self) -> int:
        """Records a Publisher refused because nobody wanted their topic."""
        return self._refused

    def extend(self, records, now_ns=None) -> bool:
        """Add many ``(topic, payload)`` records in one call; True when a
        flush is due.  On an error the records before the bad one are kept."""
        cdef uint64_t now = _now(now_ns)
        cdef bytes t, p
        cdef int rc = 0
        cdef bint due = False
        for index, rec in enumerate(records):
            topic, payload = rec
            t = _as_bytes(topic)
            p = _as_bytes(payload)
            _lock(&self._lock)
            rc = fb_outbox_append(&self._o, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t),
                                  PyBytes_AS_STRING(p), PyBytes_GET_SIZE(p), now)
            _unlock(&self._lock)
            if _check(rc, f"record {index}") == 1:
                due = True
        return due

    def due(self, now_ns=None) -> bool:
        """Is a flush due (by count, size or age)?"""
        cdef uint64_t now = _now(now_ns)
        _lock(&self._lock)
        d = fb_outbox_due(&self._o, now)
        _unlock(&self._lock)
        return d != 0

    def deadline_ns(self):
        """When the age limit makes the batch due (monotonic ns), or None
        (empty, or no age limit).  A flush loop sleeps until then."""
        _lock(&self._lock)
        d = fb_outbox_deadline(&self._o)
        _unlock(&self._lock)
        return None if d == UINT64_MAX else d

    def take(self):
        """Hand the pending batch over (a Batch), or None if empty."""
        cdef unsigned char *buf = NULL
        cdef size_t n = 0
        _lock(&self._lock)
        rc = fb_outbox_take(&self._o, &buf, &n)
        _unlock(&self._lock)
        _check(rc, "take")
        if buf is NULL:
            return None
        return _wrap_batch(buf, n)

    def clear(self) -> None:
        """Drop the pending records."""
        _lock(&self._lock)
        fb_outbox_clear(&self._o)
        _unlock(&self._lock)

    def __len__(self) -> int:
        return fb_outbox_count(&self._o)

    @property
    def nbytes(self) -> int:
        """Encoded size of the pending batch."""
        return fb_outbox_bytes(&self._o)

    @property
    def limits(self) -> dict:
        return {"max_messages": self._o.lim.max_messages, "max_bytes": self._o.lim.max_bytes,
                "max_delay": self._o.lim.max_age_ns / 1e9, "checksum": bool(self._o.lim.checksum)}

    def __repr__(self) -> str:
        return f"<fastbus.Outbox records={len(self)} bytes={self.nbytes}>"


cdef class Publisher:
    """The publish path of a client as one call into C: the publisher-side
    filter (``wanted``, a Trie or None for no filter), the append to
    ``outbox``, and ``wake()`` when the sender has work.  ``publish``
    returns 1, or 0 when nobody wants the channel.  Attributes are set by
    the client.

    Batches stay bounded when the sender falls behind: a full batch the
    sender has not taken yet is sealed (kept aside as it is) and the next
    record starts a new one, so a batch never grows past the outbox's
    ``max_messages``/``max_bytes`` by more than one record.  The sender
    takes sealed batches first, oldest first, with ``take()``.  When the
    sealed batches and the outbox together hold ``max_buffer_bytes`` (0: no
    limit), ``publish`` waits for the sender to take some, at most
    ``block_timeout`` seconds (None: no limit), then raises PublishTimeout
    (its message says ``block_reason()`` if set) without queuing the
    message.  A closed publisher raises ``closed_error(closed_message)``."""

    def __cinit__(self, Outbox outbox not None, wake not None):
        self.outbox = outbox
        self.wanted = None
        self.wake = wake
        self.closed = False
        self.closed_error = RuntimeError
        self.closed_message = "client is closed"
        self.pending_error = None
        self.max_buffer_bytes = 0
        self.block_timeout = None
        self.block_reason = None
        self._room = None
        self._waiting = 0
        self._sealed = deque()
        self._sealed_bytes = 0
        self._sealed_count = 0

    def publish(self, channel, message) -> int:
        """Queue a message; 0 if no subscriber wants its channel."""
        if self.closed:
            raise self.closed_error(self.closed_message)
        if self.pending_error is not None:
            # An earlier failure, reported once, by the next call; this
            # call's message is not queued.
            err, self.pending_error = self.pending_error, None
            raise err
        cdef bytes t = _as_message(channel)
        cdef bytes p = _as_message(message)
        cdef Outbox ob = self.outbox
        cdef object w = self.wanted
        cdef Trie trie
        cdef int rc, took = FB_OK
        cdef bint starts
        cdef unsigned char *sealed = NULL
        cdef size_t sealed_len = 0, sealed_count = 0
        if w is not None:
            trie = <Trie>w
            _lock(&trie._lock)
            rc = fb_trie_any_match(trie._t, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t))
            _unlock(&trie._lock)
            if rc == 0:
                ob._refused += 1
                return 0
        if self.max_buffer_bytes and \
                self._sealed_bytes + <Py_ssize_t>fb_outbox_bytes(&ob._o) >= self.max_buffer_bytes:
            self.wait_for_room()
        _lock(&ob._lock)
        if fb_outbox_full(&ob._o):
            # The sender has not taken this full batch yet: seal it.
            sealed_count = fb_outbox_count(&ob._o)
            took = fb_outbox_take(&ob._o, &sealed, &sealed_len)
        starts = fb_outbox_count(&ob._o) == 0
        # The outbox uses the time only for the first record of a batch.
        rc = fb_outbox_append(&ob._o, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t), PyBytes_AS_STRING(p),
                              PyBytes_GET_SIZE(p), fb_now_ns() if starts else 0)
        if rc >= 0:
            ob._accepted += 1
        _unlock(&ob._lock)
        if sealed is not NULL:
            self._sealed.append((_wrap_batch(sealed, sealed_len), sealed_count))
            self._sealed_bytes += sealed_len
            self._sealed_count += sealed_count
        if took < 0:
            _raise(took, "publish")
        if rc < 0:
            _raise(rc, "publish")
        # Wake the sender when a batch starts (it then sleeps until the
        # batch's deadline, not until its own next timer) and when it
        # becomes due; not for every record: a wake (a pipe write) per
        # record tripled the cost of publish under load.
        if rc == 1 or (starts and sealed is NULL):
            self.wake()
        return 1

    def take(self, bint force=False):
        """For the sender: ``(batch, records)`` of the oldest sealed batch,
        else of the outbox's batch if it is due (or ``force``), else None."""
        cdef Outbox ob = self.outbox
        cdef unsigned char *buf = NULL
        cdef size_t n = 0, count = 0
        cdef int rc = FB_OK
        if self._sealed:
            item = self._sealed.popleft()
            self._sealed_bytes -= len(<Batch>item[0])
            self._sealed_count -= <Py_ssize_t>item[1]
        else:
            _lock(&ob._lock)
            if fb_outbox_count(&ob._o) and (force or fb_outbox_due(&ob._o, fb_now_ns())):
                count = fb_outbox_count(&ob._o)
                rc = fb_outbox_take(&ob._o, &buf, &n)
            _unlock(&ob._lock)
            _check(rc, "take")
            if buf is NULL:
                return None
            item = (_wrap_batch(buf, n), count)
        if self._waiting:
            with self._room:
                self._room.notify_all()
        return item

    def wait_for_room(self) -> None:
        """Block until the buffer is below max_buffer_bytes (publish() calls
        this; asyncio wrappers call it in a thread): PublishTimeout after
        block_timeout seconds, closed_error if the publisher closes."""
        if self._room is None:
            self._room = threading.Condition()
        deadline = None if self.block_timeout is None else time.monotonic() + self.block_timeout
        with self._room:
            self._waiting += 1
            try:
                while self.buffered_bytes >= self.max_buffer_bytes:
                    if self.closed:
                        raise self.closed_error(self.closed_message)
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        why = self.block_reason() if self.block_reason is not None else "the sender is behind"
                        raise PublishTimeout(f"publish: {self.buffered_bytes} bytes waiting to be sent for "
                                             f"{self.block_timeout} s: {why}")
                    self.wake()
                    self._room.wait(0.1 if left is None else min(left, 0.1))
            finally:
                self._waiting -= 1

    @property
    def buffered_bytes(self) -> int:
        """Bytes queued: sealed batches and the outbox's batch."""
        return self._sealed_bytes + <Py_ssize_t>fb_outbox_bytes(&self.outbox._o)

    @property
    def queued(self) -> int:
        """Messages queued, not yet taken by the sender."""
        return self._sealed_count + <Py_ssize_t>fb_outbox_count(&self.outbox._o)

    def has_sealed(self) -> bool:
        """Is a full batch waiting for the sender?"""
        return bool(self._sealed)


def encode(records, *, bint checksum=False) -> Batch:
    """Encode ``(topic, payload)`` records into one Batch (no records: a
    valid empty batch)."""
    cdef Outbox ob = Outbox(0, 0, None, checksum)
    ob.extend(records, 0)
    b = ob.take()
    return _empty_batch(checksum) if b is None else b


cdef Batch _empty_batch(bint checksum):
    # An outbox never hands over an empty batch, so build the header here.
    cdef bytes hdr = b"FB\x01" + (b"\x01" if checksum else b"\x00") + b"\x00\x00\x00\x00"
    if checksum:
        hdr += (<uint32_t>fb_crc32c(0, PyBytes_AS_STRING(hdr), 8)).to_bytes(4, "little")
    cdef size_t n = PyBytes_GET_SIZE(hdr)
    cdef unsigned char *buf = <unsigned char *>malloc(n)
    if buf is NULL:
        raise MemoryError()
    memcpy(buf, PyBytes_AS_STRING(hdr), n)
    return _wrap_batch(buf, n)


def batch_count(data) -> int:
    """Number of records a batch declares (its header only is checked)."""
    cdef Py_buffer view
    cdef uint32_t n = 0
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        _check(fb_batch_header(view.buf, <size_t>view.len, &n, NULL), "batch")
    finally:
        PyBuffer_Release(&view)
    return n


def decode(data, *, uint32_t max_topic=0, uint32_t max_payload=0, uint32_t max_records=0,
           bint require_checksum=False) -> list:
    """Validate a whole batch and return its ``(topic, payload)`` records.

    Every length is checked before use; malformed, truncated, unknown-version
    or checksum-failing input raises BatchError (a ValueError) and returns
    nothing.  The limits (0: none) bound what a network peer may send."""
    cdef Py_buffer view
    cdef fb_decode_limits lim
    cdef uint32_t count = 0
    cdef size_t n = 0, i, cap
    cdef int rc
    cdef fb_record *recs = NULL
    lim.max_topic = max_topic
    lim.max_payload = max_payload
    lim.max_records = max_records
    lim.require_checksum = require_checksum
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        rc = fb_batch_header(view.buf, <size_t>view.len, &count, NULL)
        _check(rc, "batch")
        # A count the buffer cannot hold is rejected by the decoder; do not
        # allocate for it first.
        cap = count if count <= (<size_t>view.len) // 2 else 0
        recs = <fb_record *>PyMem_Malloc((cap if cap else 1) * sizeof(fb_record))
        if recs is NULL:
            raise MemoryError()
        if <size_t>view.len >= NOGIL_MIN_BYTES:
            with nogil:
                rc = fb_batch_decode(view.buf, <size_t>view.len, &lim, recs if cap else NULL, cap, &n)
        else:
            rc = fb_batch_decode(view.buf, <size_t>view.len, &lim, recs if cap else NULL, cap, &n)
        _check(rc, "batch")
        return _records_to_list(recs, n)
    finally:
        PyMem_Free(recs)
        PyBuffer_Release(&view)


# -- decoded topics ---------------------------------------------------------
#
# A batch repeats its topics: a consumer of 50 channels gets each one
# thousands of times.  Decoding keeps the bytes object last made for a topic
# in a small direct-mapped table and hands the same (immutable) object out
# again: one allocation fewer per record, and a topic whose hash is already
# computed when it is used as a dict key.  Only short topics are kept.

cdef enum:
    _TC_SLOTS = 64
    _TC_MAX_LEN = 64

cdef struct _topic_cache:
    PyObject *slot[_TC_SLOTS]


cdef inline uint32_t _tc_slot(const unsigned char *s, size_t n) noexcept nogil:
    cdef uint64_t h = (<uint64_t>0xcbf29ce484222325ULL) ^ n     # FNV-1a over at most 64 bytes
    cdef size_t i
    for i in range(n):
        h = (h ^ s[i]) * (<uint64_t>0x100000001b3ULL)
    return <uint32_t>((h ^ (h >> 29)) & (_TC_SLOTS - 1))


cdef inline object _tc_get(_topic_cache *c, const char *s, size_t n):
    if n > _TC_MAX_LEN:
        return PyBytes_FromStringAndSize(s, n)
    cdef uint32_t k = _tc_slot(<const unsigned char *>s, n)
    cdef PyObject *o = c.slot[k]
    if o is not NULL and <size_t>PyBytes_GET_SIZE(<object>o) == n and \
            memcmp(PyBytes_AS_STRING(<object>o), s, n) == 0:
        return <object>o
    cdef object b = PyBytes_FromStringAndSize(s, n)
    Py_INCREF(b)
    c.slot[k] = <PyObject *>b
    Py_XDECREF(o)
    return b


cdef inline void _tc_clear(_topic_cache *c) noexcept:
    cdef int i
    for i in range(_TC_SLOTS):
        Py_XDECREF(c.slot[i])
        c.slot[i] = NULL


cdef list _records_to_list(const fb_record *recs, size_t n):
    """[(topic, payload)] as bytes.  The tuples hold only bytes, so they can
    never be part of a reference cycle: untracking them keeps a decoded batch
    of thousands of records from driving the cyclic GC (a measured 4x on
    large batches held at once)."""
    cdef list out = PyList_New(n)
    cdef size_t i
    cdef object t, p
    cdef tuple tup
    cdef _topic_cache cache
    memset(&cache, 0, sizeof(cache))
    try:
        for i in range(n):
            t = _tc_get(&cache, <const char *>recs[i].topic, recs[i].topic_len)
            p = PyBytes_FromStringAndSize(<const char *>recs[i].payload, recs[i].payload_len)
            tup = PyTuple_New(2)
            Py_INCREF(t)
            PyTuple_SET_ITEM(tup, 0, t)
            Py_INCREF(p)
            PyTuple_SET_ITEM(tup, 1, p)
            PyObject_GC_UnTrack(<void *>tup)
            Py_INCREF(tup)
            PyList_SET_ITEM(out, i, tup)
    finally:
        _tc_clear(&cache)
    return out


cdef str _K_TYPE = "type", _K_PATTERN = "pattern", _K_CHANNEL = "channel", _K_DATA = "data"


def decode_messages(data, dict classes not None, classify not None, bint utf8=False) -> list:
    """Decode a batch straight into redis-py message dicts, for
    ``PubSub.listen()`` / ``get_message()``: one call per batch.

    ``classes`` maps a channel (bytes) to ``(type, pattern)``, or to None for
    a channel no subscription matches any more (those records are skipped);
    ``classify(channel)`` fills it for channels not yet in it.  With ``utf8``,
    channels and payloads are decoded to str."""
    cdef Py_buffer view
    cdef fb_record *recs = NULL
    cdef uint32_t count = 0
    cdef size_t n = 0, i, cap
    cdef int rc
    cdef list out = []
    cdef PyObject *found
    cdef object topic, payload, cls, d
    cdef _topic_cache cache
    memset(&cache, 0, sizeof(cache))
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        _check(fb_batch_header(view.buf, <size_t>view.len, &count, NULL), "batch")
        cap = count if count <= (<size_t>view.len) // 2 else 0
        recs = <fb_record *>PyMem_Malloc((cap if cap else 1) * sizeof(fb_record))
        if recs is NULL:
            raise MemoryError()
        rc = fb_batch_decode(view.buf, <size_t>view.len, NULL, recs if cap else NULL, cap, &n)
        _check(rc, "batch")
        for i in range(n):
            topic = _tc_get(&cache, <const char *>recs[i].topic, recs[i].topic_len)
            found = PyDict_GetItem(classes, topic)
            cls = <object>found if found is not NULL else classify(topic)
            if cls is None:
                continue
            if utf8:
                payload = PyUnicode_DecodeUTF8(<const char *>recs[i].payload, recs[i].payload_len, NULL)
                topic = PyUnicode_DecodeUTF8(<const char *>recs[i].topic, recs[i].topic_len, NULL)
            else:
                payload = PyBytes_FromStringAndSize(<const char *>recs[i].payload, recs[i].payload_len)
            d = PyDict_New()
            PyDict_SetItem(d, _K_TYPE, (<tuple>cls)[0])
            PyDict_SetItem(d, _K_PATTERN, (<tuple>cls)[1])
            PyDict_SetItem(d, _K_CHANNEL, topic)
            PyDict_SetItem(d, _K_DATA, payload)
            PyObject_GC_UnTrack(<void *>d)   # only str/bytes/None inside: no cycles
            out.append(d)
        return out
    finally:
        _tc_clear(&cache)
        PyMem_Free(recs)
        PyBuffer_Release(&view)


def resp_scan(data, Py_ssize_t start=0, Py_ssize_t end=-1, Py_ssize_t max_replies=-1) -> tuple:
    """Scan the complete Redis replies in ``data[start:end]`` (at most
    ``max_replies``; -1: all) without building them: returns ``(replies,
    consumed, int_sum, error_indexes, first_error)``, where ``consumed`` is
    the bytes those replies took (an incomplete reply at the end is left),
    ``int_sum`` the sum of integer replies, ``error_indexes`` the positions
    of error replies among them and ``first_error`` the first one's message
    (bytes) or None.  Bytes that are not RESP raise BatchError: the
    connection they came from is unusable."""
    cdef Py_buffer view
    cdef fb_resp_tally t
    cdef uint32_t idx[64]
    cdef const unsigned char *p
    cdef size_t avail, cap
    cdef int rc
    cdef list errs = []
    cdef size_t done = 0, k, total_consumed = 0
    cdef int64_t total_sum = 0
    cdef object first = None
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if end < 0 or end > view.len:
            end = view.len
        if start < 0 or start > end:
            raise ValueError("resp_scan: start out of range")
        p = <const unsigned char *>view.buf + start
        avail = <size_t>(end - start)
        cap = <size_t>max_replies if max_replies >= 0 else <size_t>-1
        # Errors are rare; when more than fit in idx arrive, scan on from
        # the last one reported so that every index is returned.
        while True:
            with nogil:
                rc = fb_resp_scan(p + total_consumed, avail - total_consumed, cap - done, &t, idx, 64)
            for k in range(t.errors if t.errors < 64 else 64):
                errs.append(done + idx[k])
            if first is None and t.errors:
                first = PyBytes_FromStringAndSize(<const char *>(p + total_consumed + t.first_err_off),
                                                  t.first_err_len)
            if rc < 0 or t.errors <= 64:
                done += t.replies
                total_consumed += t.consumed
                total_sum += t.int_sum
                if rc < 0:
                    _raise(rc, f"redis reply after {done} good ones")
                break
            # More than 64 errors: rescan only up to and including the 64th.
            rc = fb_resp_scan(p + total_consumed, avail - total_consumed, idx[63] + 1, &t, NULL, 0)
            done += t.replies
            total_consumed += t.consumed
            total_sum += t.int_sum
        return done, total_consumed, total_sum, errs, first
    finally:
        PyBuffer_Release(&view)


cdef dict _PUSH_KINDS = {k.encode(): k for k in (
    "message", "pmessage", "smessage", "subscribe", "unsubscribe", "psubscribe", "punsubscribe",
    "ssubscribe", "sunsubscribe", "pong")}


cdef inline object _elem(_topic_cache *cache, fb_resp_elem *e, bint utf8, bint intern):
    if e.ptr is NULL:
        return None
    if e.is_int:
        return int(PyBytes_FromStringAndSize(<const char *>e.ptr, e.len))
    if utf8:
        return PyUnicode_DecodeUTF8(<const char *>e.ptr, e.len, "replace")
    if intern:
        return _tc_get(cache, <const char *>e.ptr, e.len)
    return PyBytes_FromStringAndSize(<const char *>e.ptr, e.len)


def resp_pubsub_decode(data, Py_ssize_t start=0, Py_ssize_t end=-1, bint as_dicts=True,
                       bint utf8=False) -> tuple:
    """Decode the complete pub/sub push messages in ``data[start:end]`` in
    one call: ``(consumed, items, notices)``.  With ``as_dicts`` every
    message is a redis-py dict (``type``, ``pattern``, ``channel``,
    ``data``) in ``items``, in order; otherwise ``items`` holds
    ``(channel, data)`` tuples of the data messages and ``notices`` the
    dicts of the others (confirmations, pong).  Bytes that are not push
    messages raise BatchError (the connection is unusable)."""
    cdef Py_buffer view
    cdef fb_resp_elem el[4]
    cdef size_t used = 0, pos
    cdef int n
    cdef list items = [], notices = []
    cdef _topic_cache cache
    cdef object kind, d, channel, payload, pattern
    memset(&cache, 0, sizeof(cache))
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if end < 0 or end > view.len:
            end = view.len
        if start < 0 or start > end:
            raise ValueError("resp_pubsub_decode: start out of range")
        pos = <size_t>start
        while pos < <size_t>end:
            n = fb_resp_flat_array(<const unsigned char *>view.buf + pos, <size_t>end - pos, el, 4, &used)
            if n < 0:
                _raise(n, "redis pub/sub message")
            if n == 0:
                break
            pos += used
            if el[0].is_int or el[0].ptr is NULL:
                raise BatchError("redis pub/sub message: no type", "malformed")
            kind = _PUSH_KINDS.get(PyBytes_FromStringAndSize(<const char *>el[0].ptr, el[0].len))
            if kind is None:
                raise BatchError("redis pub/sub message: unknown type", "malformed")
            pattern = None
            if kind == "pmessage" and n == 4:
                pattern = _elem(&cache, &el[1], utf8, True)
                channel = _elem(&cache, &el[2], utf8, True)
                payload = _elem(&cache, &el[3], utf8, False)
            elif n == 3:
                channel = _elem(&cache, &el[1], utf8, True)
                payload = _elem(&cache, &el[2], utf8, False)
            elif kind == "pong" and n == 2:
                channel = None
                payload = _elem(&cache, &el[1], utf8, False)
            else:
                raise BatchError(f"redis pub/sub message: {kind} with {n} elements", "malformed")
            if not as_dicts and (kind == "message" or kind == "pmessage" or kind == "smessage"):
                t = (channel, payload)
                PyObject_GC_UnTrack(<void *>t)
                items.append(t)
                continue
            d = {"type": kind, "pattern": pattern, "channel": channel, "data": payload}
            PyObject_GC_UnTrack(<void *>d)
            (items if as_dicts else notices).append(d)
        return pos - <size_t>start, items, notices
    finally:
        _tc_clear(&cache)
        PyBuffer_Release(&view)


def key_slot(key) -> int:
    """The Redis Cluster hash slot of a key (bytes or str), hash tags included."""
    cdef bytes k = _as_bytes(key)
    return fb_resp_key_slot(PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k))


cdef class RespPump:
    """Streams a Redis pipeline over a socket with the GIL released (see
    fb_resp.h): ``pump(fd, data, need, timeout)`` writes ``data`` while
    reading replies and returns once it is all written and ``need`` more
    replies are consumed; replies beyond that wait in this object for the
    next call.  Returns ``(replies, int_sum, error_indexes, first_error,
    error)``: ``error`` is None or the exception that stopped it (the
    counts then cover the replies read before it).  POSIX sockets only."""
    cdef fb_resp_reader _rd

    def __cinit__(self):
        fb_resp_reader_init(&self._rd)

    def __dealloc__(self):
        fb_resp_reader_destroy(&self._rd)

    def reset(self) -> None:
        """Forget buffered bytes (a new connection)."""
        fb_resp_reader_reset(&self._rd)

    def pump(self, int fd, data, size_t need, double timeout) -> tuple:
        cdef Py_buffer view
        cdef bint have_view = False
        cdef const void *buf = NULL
        cdef size_t n = 0, k, nidx
        cdef fb_resp_tally t
        cdef int rc, err = 0
        cdef int ms = -1 if timeout < 0 else <int>(timeout * 1000)
        cdef uint32_t *idx
        if data is not None:
            PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
            have_view = True
            buf = view.buf
            n = <size_t>view.len
        idx = <uint32_t *>PyMem_Malloc((need if need else 1) * sizeof(uint32_t))
        if idx is NULL:
            if have_view:
                PyBuffer_Release(&view)
            raise MemoryError()
        try:
            with nogil:
                rc = fb_resp_pump(fd, buf, n, need, ms, &self._rd, &t, idx, need)
                if rc == FB_EIO:
                    err = errno
            nidx = t.errors if t.errors < need else need
            errs = [idx[k] for k in range(nidx)]
            first = None
            if self._rd.first_err_len:
                first = PyBytes_FromStringAndSize(self._rd.first_err, self._rd.first_err_len)
            return (t.replies, t.int_sum, errs, first,
                    None if rc == FB_OK else _error(rc, "redis pipeline", err))
        finally:
            PyMem_Free(idx)
            if have_view:
                PyBuffer_Release(&view)


def crc32c(data, uint32_t crc=0) -> int:
    """CRC-32C (Castagnoli) of a bytes-like object, continuing from ``crc``."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return fb_crc32c(crc, view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)


# --------------------------------------------------------------------------
# Router

cdef enum:
    LINKS_PER_CALL = 4096


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


cdef class Router:
    """A broker's routing step: received batches into per-link outboxes.

    Links are integers ``0 .. 2**31 - 1``, the subscriber ids of ``trie``.
    ``route(batch, source)`` validates a batch whole, matches all its topics
    in one call and appends each record to the outbox of every matching link
    except ``source`` (a message never goes back where it came from).  Then
    ``due()`` lists the links whose outbox is due and ``take(link)`` hands a
    batch over.  Outbox limits as in :class:`Outbox`; decoder limits (0: none)
    bound what a peer may send.
    """

    def __cinit__(self, Trie trie not None, Py_ssize_t max_messages=1000, Py_ssize_t max_bytes=1 << 20,
                  max_delay=0.001, bint checksum=False, uint32_t max_topic=0, uint32_t max_payload=0,
                  uint32_t max_records=0):
        cdef fb_outbox_limits lim = _limits(max_messages, max_bytes, max_delay, checksum)
        self._lim.max_topic = max_topic
        self._lim.max_payload = max_payload
        self._lim.max_records = max_records
        self._lim.require_checksum = 0
        self._trie = trie
        self._r = fb_router_new(&lim)
        if self._r is NULL:
            raise MemoryError("cannot allocate a router")

    def __dealloc__(self):
        if self._r is not NULL:
            fb_router_free(self._r)

    @property
    def trie(self) -> Trie:
        return self._trie

    def add_link(self, uint32_t link) -> None:
        """Give a link an outbox (idempotent)."""
        _lock(&self._lock)
        rc = fb_router_add_link(self._r, link)
        _unlock(&self._lock)
        _check(rc, "add_link")

    def remove_link(self, uint32_t link) -> int:
        """Drop a link's outbox; returns how many records it still held."""
        _lock(&self._lock)
        n = fb_router_remove_link(self._r, link)
        _unlock(&self._lock)
        return n

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

    def due(self, now_ns=None) -> list:
        """Links whose outbox is due now (by count, size or age), up to 4096
        per call: take their batches, then call again for more."""
        return _router_links(self, True, _now(now_ns))

    def pending(self) -> list:
        """Links whose outbox holds records, due or not (up to 4096 per call)."""
        return _router_links(self, False, 0)

    def take(self, uint32_t link):
        """Hand over a link's pending batch (a Batch), or None."""
        cdef unsigned char *buf = NULL
        cdef size_t n = 0
        cdef fb_outbox *ob
        cdef int rc = FB_OK
        _lock(&self._lock)
        ob = fb_router_outbox(self._r, link)
        if ob is not NULL:
            rc = fb_outbox_take(ob, &buf, &n)
        _unlock(&self._lock)
        _check(rc, "take")
        return None if buf is NULL else _wrap_batch(buf, n)

    def append(self, uint32_t link, topic, payload, now_ns=None) -> bool:
        """Append one record to a link's outbox directly; True when due.
        KeyError if the link has no outbox."""
        cdef bytes t = _as_bytes(topic)
        cdef bytes p = _as_bytes(payload)
        cdef uint64_t now = _now(now_ns)
        cdef fb_outbox *ob
        cdef int rc
        _lock(&self._lock)
        ob = fb_router_outbox(self._r, link)
        if ob is NULL:
            _unlock(&self._lock)
            raise KeyError(f"no link {link}")
        rc = fb_outbox_append(ob, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t), PyBytes_AS_STRING(p),
                              PyBytes_GET_SIZE(p), now)
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
        """Earliest time an outbox becomes due by age (monotonic ns), or None."""
        _lock(&self._lock)
        d = fb_router_deadline(self._r)
        _unlock(&self._lock)
        return None if d == UINT64_MAX else d

    def stats(self) -> dict:
        """batches, records, bytes, deliveries, unrouted, rejected (cumulative)."""
        cdef fb_router_stats s
        _lock(&self._lock)
        fb_router_get_stats(self._r, &s)
        _unlock(&self._lock)
        return {"batches": s.batches, "records": s.records, "bytes": s.bytes,
                "deliveries": s.deliveries, "unrouted": s.unrouted, "rejected": s.rejected}


# -- fastbus.queue: work-queue items (see fastbus/queue/_lua.py for the format)

DEF QUEUE_HEADER = 21


cdef inline uint64_t _be64(const unsigned char *p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v = (v << 8) | p[i]
    return v


cdef class QueueMessage:
    """A message as a :mod:`fastbus.queue` consumer gets it (exported there as
    ``Message``).

    ``id``: monotonic per queue (per topic for topic messages); ``payload``:
    the bytes put; ``created_at``: server time of the put, in seconds since
    the epoch; ``deliveries``: 1 on the first delivery, counting redeliveries
    after requeues and crashed consumers (in a message looked at with
    ``peek``: the deliveries so far).  ``ack()``, ``reject()`` and
    ``requeue()`` settle it through the consumer that got it (coroutines for
    an asyncio consumer)."""

    cdef readonly object id
    cdef readonly bytes payload
    cdef readonly double created_at
    cdef readonly long deliveries
    cdef readonly bytes _key           # the id as 8 big-endian bytes: its field in the unacked hash
    cdef readonly object _consumer

    def __init__(self, id, bytes payload not None, double created_at, long deliveries,
                 bytes _key=b"", _consumer=None):
        self.id = id
        self.payload = payload
        self.created_at = created_at
        self.deliveries = deliveries
        self._key = _key
        self._consumer = _consumer

    def ack(self):
        return self._consumer.ack(self)

    def reject(self):
        return self._consumer.reject(self)

    def requeue(self):
        return self._consumer.requeue(self)

    def __repr__(self):
        return (f"Message(id={self.id!r}, payload={self.payload!r}, created_at={self.created_at!r}, "
                f"deliveries={self.deliveries!r})")


def queue_decode(list items not None, consumer=None) -> list:
    """Work-queue items as the scripts return them (21-byte header + payload)
    -> :class:`QueueMessage` objects, in one call.  With a consumer they are
    being delivered (``deliveries`` counts this one); without, looked at.
    ValueError on an item too short or of another version."""
    cdef Py_ssize_t i, n = len(items), size
    cdef const unsigned char *p
    cdef QueueMessage m
    cdef long this = 0 if consumer is None else 1
    cdef list out = PyList_New(n)
    for i in range(n):
        item = items[i]
        if not PyBytes_CheckExact(item):
            raise TypeError(f"queue item {i} is {type(item).__name__}, not bytes")
        size = PyBytes_GET_SIZE(item)
        p = <const unsigned char *>PyBytes_AS_STRING(item)
        if size < QUEUE_HEADER or p[0] != 1:
            raise ValueError(f"queue item {i} is not a fastbus v1 item ({size} bytes)")
        m = QueueMessage.__new__(QueueMessage)
        m.deliveries = ((<long>p[1] << 24) | (<long>p[2] << 16) | (<long>p[3] << 8) | p[4]) + this
        m.id = _be64(p + 5)
        m.created_at = <double>_be64(p + 13) / 1000.0
        m.payload = PyBytes_FromStringAndSize(<const char *>p + QUEUE_HEADER, size - QUEUE_HEADER)
        m._key = PyBytes_FromStringAndSize(<const char *>p + 5, 8)
        m._consumer = consumer
        Py_INCREF(m)
        PyList_SET_ITEM(out, i, m)
    return out


# -- fastbus.queue topics: READ replies (one value per id: 8-byte created ms
#    big-endian, then the payload; None where the id is not retained)

cdef inline const unsigned char *_topic_value(object v, Py_ssize_t i, Py_ssize_t *size) except NULL:
    if not PyBytes_CheckExact(v):
        raise TypeError(f"topic value {i} is {type(v).__name__}, not bytes")
    size[0] = PyBytes_GET_SIZE(v)
    if size[0] < 8:
        raise ValueError(f"topic value {i} is {size[0]} bytes, shorter than its 8-byte timestamp")
    return <const unsigned char *>PyBytes_AS_STRING(v)


def topic_decode(list values not None, uint64_t first) -> list:
    """A topic READ reply for ids ``first, first+1, ...`` -> the retained
    ones as :class:`QueueMessage` (``deliveries`` 0), in one call."""
    cdef Py_ssize_t i, n = len(values), size
    cdef const unsigned char *p
    cdef QueueMessage m
    cdef list out = []
    for i in range(n):
        v = values[i]
        if v is None:
            continue
        p = _topic_value(v, i, &size)
        m = QueueMessage.__new__(QueueMessage)
        m.deliveries = 0
        m.id = first + <uint64_t>i
        m.created_at = <double>_be64(p) / 1000.0
        m.payload = PyBytes_FromStringAndSize(<const char *>p + 8, size - 8)
        m._key = b""
        m._consumer = None
        out.append(m)
    return out


def topic_columns(list values not None, uint64_t first) -> tuple:
    """A topic READ reply -> Arrow-ready column buffers of the retained ids,
    with no Python object per message: ``(rows, ids, micros, offsets, data)``
    where ``ids`` and ``micros`` (created, microseconds since the epoch) are
    native int64 arrays, ``offsets`` native int32 (rows + 1) and ``data`` the
    payloads end to end: the buffers of an Arrow int64, timestamp[us] and
    binary column."""
    cdef Py_ssize_t i, n = len(values), size, rows = 0, total = 0
    cdef const unsigned char *p
    for i in range(n):
        v = values[i]
        if v is not None:
            p = _topic_value(v, i, &size)
            rows += 1
            total += size - 8
    if total > 0x7fffffff:
        raise ValueError("more than 2 GiB of payloads in one read: read a smaller range")
    ids = PyBytes_FromStringAndSize(NULL, rows * 8)
    micros = PyBytes_FromStringAndSize(NULL, rows * 8)
    offsets = PyBytes_FromStringAndSize(NULL, (rows + 1) * 4)
    data = PyBytes_FromStringAndSize(NULL, total)
    cdef int64_t *pid = <int64_t *>PyBytes_AS_STRING(ids)
    cdef int64_t *pts = <int64_t *>PyBytes_AS_STRING(micros)
    cdef int32_t *pof = <int32_t *>PyBytes_AS_STRING(offsets)
    cdef char *pd = PyBytes_AS_STRING(data)
    cdef Py_ssize_t r = 0, at = 0
    pof[0] = 0
    for i in range(n):
        v = values[i]
        if v is None:
            continue
        p = _topic_value(v, i, &size)
        if r >= rows or at + size - 8 > total:      # the list changed under us (a finalizer)
            raise RuntimeError("topic values changed while being read")
        pid[r] = <int64_t>(first + <uint64_t>i)
        pts[r] = <int64_t>_be64(p) * 1000
        memcpy(pd + at, p + 8, size - 8)
        at += size - 8
        r += 1
        pof[r] = <int32_t>at
    if r != rows:
        raise RuntimeError("topic values changed while being read")
    return rows, ids, micros, offsets, data
