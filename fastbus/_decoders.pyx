# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""redis-py message dicts (and ``(channel, data)`` tuples) built in one
call per batch: from a broker batch (fb_batch.h) for ``PubSub``, and from
RESP push messages (fb_resp.h) for ``fastbus.redis.Subscriber``.

``PubSubBase`` is the compiled base of fastbus's ``PubSub``: its
``get_message()`` hands out a dict built here with no Python frame when
one is ready, the common case of a busy subscriber.

The shape users see (redis-py's dict keys and kinds) lives here and in
fastbus/_messages.py, which drives these calls; fastbus._core wraps the C
core without knowing it.  A batch's records come checked from _core
(``_batch_records``, as its own decode() takes them), and C errors become
exceptions through _core's one place (``_raise``, fastbus/core/errors.pxd).
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_GetItem, PyDict_New, PyDict_SetItem
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memset

from fastbus._core cimport Trie, _as_bytes, _batch_records, _check, _header_memo, _headers_memo, _hm_clear, _lock
from fastbus._core cimport _raise, _text_or_bytes, _unlock
from fastbus.includes.fb_batch cimport fb_record, fb_record_reply_to
from fastbus.includes.fb_common cimport fb_idvec, fb_idvec_free, fb_idvec_init
from fastbus.includes.fb_glob cimport fb_glob_match
from fastbus.includes.fb_trie cimport fb_trie_match
from fastbus.includes.fb_resp cimport fb_resp_elem, fb_resp_flat_array

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)

from fastbus.errors import BatchError

include "core/topic_cache.pxi"

cdef str _K_TYPE = "type", _K_PATTERN = "pattern", _K_CHANNEL = "channel", _K_DATA = "data"
cdef str _K_HEADERS = "headers", _K_REPLY_TO = "reply_to"


cdef tuple _EXACT = ("message", None)
#: Channels a Matcher remembers the answer for before it starts again.
cdef Py_ssize_t _CLASSES_MAX = 100_000


@cython.final
cdef class Matcher:
    """A PubSub's subscriptions as its decoder reads them: which one a
    received channel's records are for, answered in C (the decoder never
    calls back into Python for a channel it has not met).

    ``trie`` maps each subscription's local key (a channel; a pattern's
    literal prefix, as a prefix key) to its id; ``entries`` maps the id to
    ``(name, is pattern, local key, is glob, ...)`` (the PubSub keeps its
    own fields after those four); ``classes`` caches the answer per channel
    and is cleared by the PubSub whenever its subscriptions change.  The
    answer: ``("message", None)`` if a channel subscription matches,
    ``("pmessage", pattern)`` for the matching pattern of the longest
    literal prefix (of those, the first subscribed; str with ``text``),
    None if nothing matches (unsubscribed while in flight, or only a
    glob's literal prefix matched)."""

    cdef readonly Trie trie
    cdef readonly dict entries
    cdef readonly dict classes
    cdef bint _text

    def __init__(self, bint text=False):
        self.trie = Trie()
        self.entries = {}
        self.classes = {}
        self._text = text

    def __call__(self, channel):
        """The answer for ``channel`` (bytes or str), cached."""
        cdef bytes c = _as_bytes(channel)
        cdef PyObject *found = PyDict_GetItem(self.classes, c)
        return <object>found if found is not NULL else self.classify(c)

    cdef object classify(self, bytes channel):
        cdef fb_idvec v
        cdef size_t k
        cdef int rc
        cdef uint64_t i, best_id = 0
        cdef Py_ssize_t best_len = -1, klen
        cdef PyObject *found
        cdef tuple e
        cdef object result = None
        fb_idvec_init(&v)
        try:
            _lock(&self.trie._lock)
            rc = fb_trie_match(self.trie._t, <const char *>channel, len(channel), &v)
            _unlock(&self.trie._lock)
            _check(rc, "match")
            for k in range(v.n):
                i = v.ids[k]
                found = PyDict_GetItem(self.entries, i)
                if found is NULL:
                    continue
                e = <tuple>found
                if not e[1]:
                    result = _EXACT
                    break
                klen = len(<bytes>e[2])
                if klen < best_len or (klen == best_len and i > best_id):
                    continue
                if e[3] and fb_glob_match(<const char *><bytes>e[0], len(<bytes>e[0]),
                                          <const char *>channel, len(channel)) != 1:
                    continue
                best_len, best_id = klen, i
                result = ("pmessage", (<bytes>e[0]).decode("utf-8") if self._text else e[0])
        finally:
            fb_idvec_free(&v)
        if len(self.classes) >= _CLASSES_MAX:
            self.classes.clear()
        self.classes[channel] = result
        return result


cdef inline object _classified(dict classes, object classify, bytes topic):
    """The class of ``topic``: cached, else a Matcher's answer (in C) or
    ``classify(topic)``'s."""
    cdef PyObject *found = PyDict_GetItem(classes, topic)
    if found is not NULL:
        return <object>found
    if type(classify) is Matcher:
        return (<Matcher>classify).classify(topic)
    return classify(topic)


def decode_messages(data, dict classes not None, classify not None, bint utf8=False, request=None) -> list:
    """Decode a batch straight into redis-py message dicts, for
    ``PubSub.listen()`` / ``get_message()``: one call per batch.

    ``classes`` maps a channel (bytes) to ``(type, pattern)``, or to None for
    a channel no subscription matches any more (those records are skipped);
    ``classify(channel)`` fills it for channels not yet in it: a
    :class:`Matcher` (whose ``classes`` it is), answered in C, or any
    callable.  With ``utf8``,
    channels and payloads are decoded to str (one that is not UTF-8 stays
    bytes: a batch is never lost for one such record).  A record with headers gets
    a ``headers`` key (a read-only :class:`fastbus.Headers` of str to bytes,
    with ``utf8`` str where a value is UTF-8; the records that repeat the
    headers of the one before share it); one without has none, so its dict is redis-py's exactly.  A request (a
    record whose headers name a reply channel) gets a ``reply_to`` key,
    the channel to answer on (bytes, str with ``utf8``), and with
    ``request`` given is the message ``request(dict)`` returns instead
    (``fastbus._messages.Request``: one call per request, none for other
    messages); the protocol's own headers (names beginning with ':') are
    not in ``headers``."""
    cdef Py_buffer view
    cdef fb_record *recs = NULL
    cdef size_t n = 0, i
    cdef list out = []
    cdef object topic, payload, cls, d, h
    cdef const unsigned char *to
    cdef uint32_t tl
    cdef _topic_cache cache
    cdef _header_memo memo
    memset(&cache, 0, sizeof(cache))
    memset(&memo, 0, sizeof(memo))
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        recs = _batch_records(&view, NULL, &n)
        for i in range(n):
            topic = _tc_get(&cache, <const char *>recs[i].topic, recs[i].topic_len)
            cls = _classified(classes, classify, topic)
            if cls is None:
                continue
            if utf8:                            # (what is not UTF-8 stays bytes: the batch's others are not lost)
                payload = _text_or_bytes(<const char *>recs[i].payload, recs[i].payload_len)
                topic = _text_or_bytes(<const char *>recs[i].topic, recs[i].topic_len)
            else:
                payload = PyBytes_FromStringAndSize(<const char *>recs[i].payload, recs[i].payload_len)
            d = PyDict_New()
            PyDict_SetItem(d, _K_TYPE, (<tuple>cls)[0])
            PyDict_SetItem(d, _K_PATTERN, (<tuple>cls)[1])
            PyDict_SetItem(d, _K_CHANNEL, topic)
            PyDict_SetItem(d, _K_DATA, payload)
            if recs[i].headers_len:             # (a read-only Headers, shared by the records that repeat it)
                h = _headers_memo(&memo, recs[i].headers, recs[i].headers_len, utf8, False)
                if h is not None:
                    PyDict_SetItem(d, _K_HEADERS, h)
                if fb_record_reply_to(&recs[i], &to, &tl):   # a request: where its reply goes
                    PyDict_SetItem(d, _K_REPLY_TO, PyUnicode_DecodeUTF8(<const char *>to, tl, "surrogateescape")
                                   if utf8 else PyBytes_FromStringAndSize(<const char *>to, tl))
                    if request is not None:
                        out.append(request(d))  # (it holds its client: tracked)
                        continue
            PyObject_GC_UnTrack(<void *>d)       # only str/bytes/None inside: no cycles
            out.append(d)
        return out
    finally:
        _tc_clear(&cache)
        _hm_clear(&memo)
        PyMem_Free(recs)
        PyBuffer_Release(&view)


def decode_matching(data, dict classes not None, classify not None) -> list:
    """``decode()`` keeping only the records a subscription still matches:
    ``classes`` and ``classify`` as for :func:`decode_messages` (a channel
    classified None is skipped).  For ``get_batch()`` while the broker may
    send more than is wanted (a glob held under its literal prefix, or an
    unsubscribe not yet in effect): one call per batch.  Records as
    ``decode()`` gives them: a third item, the headers, for a record that
    has them."""
    cdef Py_buffer view
    cdef fb_record *recs = NULL
    cdef size_t n = 0, i
    cdef list out = []
    cdef object topic, cls
    cdef tuple tup
    cdef _topic_cache cache
    cdef _header_memo memo
    memset(&cache, 0, sizeof(cache))
    memset(&memo, 0, sizeof(memo))
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        recs = _batch_records(&view, NULL, &n)
        for i in range(n):
            topic = _tc_get(&cache, <const char *>recs[i].topic, recs[i].topic_len)
            cls = _classified(classes, classify, topic)
            if cls is None:
                continue
            if recs[i].headers_len:
                tup = (topic, PyBytes_FromStringAndSize(<const char *>recs[i].payload, recs[i].payload_len),
                       _headers_memo(&memo, recs[i].headers, recs[i].headers_len, False, True))
            else:
                tup = (topic, PyBytes_FromStringAndSize(<const char *>recs[i].payload, recs[i].payload_len))
            PyObject_GC_UnTrack(<void *>tup)   # bytes (and a dict of them) only: no cycles
            out.append(tup)
        return out
    finally:
        _tc_clear(&cache)
        _hm_clear(&memo)
        PyMem_Free(recs)
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


cdef class PubSubBase:
    """The part of fastbus's PubSub in C that a busy subscriber's
    ``get_message()`` goes through: when a message dict is ready (decoded
    here, a batch at a time) and nothing must come first, it is handed out
    in one C call.  A method in Python cost a frame and five attribute
    lookups per message: 15-20% of what a message cost its reader.
    The subclass keeps the fields (``_dicts``, ``_control``, ``_pending``:
    fastbus._messages.MessageBuffer's queues; ``_handlers``: subscriptions
    with a handler) and ``_next_message()``, the rest of the method."""

    cdef public object _dicts
    cdef public object _control
    cdef public object _pending
    cdef public Py_ssize_t _handlers

    @cython.embedsignature(False)       # (its docstring is its asyncio twin's too)
    @cython.annotation_typing(False)    # (the annotations are for users, not C types)
    def get_message(self, ignore_subscribe_messages: bool = False,
                    timeout: float | None = 0.0) -> PubSubMessage | None:
        """The next message, or None if none arrives within ``timeout``
        seconds (0: do not wait; None: wait for ever)."""
        if self._handlers == 0 and len(self._dicts) and not len(self._control) and not len(self._pending):
            return self._dicts.popleft()       # the common case
        return self._next_message(ignore_subscribe_messages, timeout, False)
