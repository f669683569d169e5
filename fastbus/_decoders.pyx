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

from fastbus._core cimport _batch_records, _header_memo, _headers_memo, _hm_clear, _raise, _text_or_bytes
from fastbus.includes.fb_batch cimport fb_record, fb_record_reply_to
from fastbus.includes.fb_resp cimport fb_resp_elem, fb_resp_flat_array

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)

from fastbus.errors import BatchError

include "core/topic_cache.pxi"

cdef str _K_TYPE = "type", _K_PATTERN = "pattern", _K_CHANNEL = "channel", _K_DATA = "data"
cdef str _K_HEADERS = "headers", _K_REPLY_TO = "reply_to"


def decode_messages(data, dict classes not None, classify not None, bint utf8=False, request=None) -> list:
    """Decode a batch straight into redis-py message dicts, for
    ``PubSub.listen()`` / ``get_message()``: one call per batch.

    ``classes`` maps a channel (bytes) to ``(type, pattern)``, or to None for
    a channel no subscription matches any more (those records are skipped);
    ``classify(channel)`` fills it for channels not yet in it.  With ``utf8``,
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
    cdef PyObject *found
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
            found = PyDict_GetItem(classes, topic)
            cls = <object>found if found is not NULL else classify(topic)
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
    cdef PyObject *found
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
            found = PyDict_GetItem(classes, topic)
            cls = <object>found if found is not NULL else classify(topic)
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
