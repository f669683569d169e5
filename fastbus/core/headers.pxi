# Message headers (csrc/fb_batch.h: a record's header block).
# Part of fastbus/_core.pyx (included there).
#
# A block is pairs `key_len varint (>= 1), key, value_len varint, value`.
# Keys are str (UTF-8 on the wire); values str (UTF-8) or bytes; the
# mapping's order is kept.  What a block may hold in all is bounded by the
# broker's max_payload, which counts payload and headers together.
#
# Both directions are per message, so both stay in C for the common case:
# encoding reads a dict's str and bytes in place (PyDict_Next, the UTF-8
# CPython keeps with an ASCII str) into one bytes object; decoding hands
# out the same str object for a name it made before (names repeat: every
# message of a traced stream says "traceparent").

from cpython.dict cimport PyDict_CheckExact, PyDict_Next, PyDict_SetItem
from cpython.unicode cimport PyUnicode_CheckExact, PyUnicode_DecodeUTF8

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL
    char *PyBytes_AS_STRING_MUT "PyBytes_AS_STRING" (object b)
    Py_ssize_t PyDict_GET_SIZE(object d)


cdef inline int _header_part(object o, const char **p, Py_ssize_t *n) except -1:
    """A header name's or value's bytes in place: 1, or 0 if it is not str
    or bytes (the caller converts it first, or refuses it)."""
    if PyUnicode_CheckExact(o):
        p[0] = PyUnicode_AsUTF8AndSize(o, n)
        return 1
    if PyBytes_CheckExact(o):
        p[0] = PyBytes_AS_STRING(o)
        n[0] = PyBytes_GET_SIZE(o)
        return 1
    return 0


cdef dict _checked_headers(object headers):
    """The slow path: any mapping, with str subclasses and bytes-like
    values, as a plain dict of str to str/bytes; or the error that says what
    is wrong."""
    try:
        items = headers.items()
    except AttributeError:
        raise TypeError(f"headers must be a mapping of str to str or bytes, not {type(headers).__name__}") from None
    cdef dict out = {}
    for key, value in items:
        if not isinstance(key, str):
            raise TypeError(f"a header name must be a str, not {type(key).__name__} ({key!r:.40})")
        if not key:
            raise ValueError("a header name must not be empty")
        if key[0] == ":":
            raise ValueError(_RESERVED.format(key))
        if isinstance(value, str):
            value = str(value)
        elif isinstance(value, (bytes, bytearray, memoryview)):
            value = bytes(value)
        else:
            raise TypeError(f"header {key!r}: a value must be str or bytes, not {type(value).__name__}")
        out[str(key)] = value
    return out


# -- what a subscriber gets ---------------------------------------------------

cdef str _READ_ONLY = ("a received message's headers are read-only (the messages of a batch that carry "
                       "the same headers share one Headers): dict(headers) is a copy to change")


cdef class Headers(dict):
    """A received message's headers: a dict to read, not to change.

    A stream's messages mostly carry the same headers (a content type, a
    tenant, a trace's context), and decoding a batch makes their mapping
    once for every record that repeats it (docs/BATCH_FORMAT.md,
    "Repeats"), so messages share one.  Everything that would change it
    raises TypeError; ``dict(headers)`` and ``headers.copy()`` are plain
    dicts to change.  It is a dict otherwise: ``isinstance(h, dict)``,
    ``==`` with a dict, ``json.dumps``, pickling and ``publish(...,
    headers=h)`` work as they do for one.  (JMS treats a received
    message's properties the same way.)"""

    def __init__(self, *args, **kwargs):
        if len(self):                       # (dict.__init__ again would change it)
            raise TypeError(_READ_ONLY)
        dict.__init__(self, *args, **kwargs)

    def __setitem__(self, key, value):
        raise TypeError(_READ_ONLY)

    def __delitem__(self, key):
        raise TypeError(_READ_ONLY)

    def __ior__(self, other):
        raise TypeError(_READ_ONLY)

    def clear(self):
        raise TypeError(_READ_ONLY)

    def pop(self, *args):
        raise TypeError(_READ_ONLY)

    def popitem(self):
        raise TypeError(_READ_ONLY)

    def setdefault(self, *args):
        raise TypeError(_READ_ONLY)

    def update(self, *args, **kwargs):
        raise TypeError(_READ_ONLY)

    def __reduce__(self):
        return (Headers, (dict(self),))

    def __copy__(self):
        return self                         # (nothing can change it: the copy may be itself)

    def __deepcopy__(self, memo):
        return self


cdef str _RESERVED = ("header {!r}: names beginning with ':' belong to the protocol "
                      "(:reply-to, :status); choose another")
cdef bytes _REPLY_TO = FB_HEADER_REPLY_TO
cdef bytes _HOLD = FB_HEADER_HOLD


cdef inline unsigned char *_put_header(unsigned char *w, bytes key, bytes value):
    cdef Py_ssize_t kn = PyBytes_GET_SIZE(key), vn = PyBytes_GET_SIZE(value)
    w += fb_put_varint(w, <uint32_t>kn)
    memcpy(w, PyBytes_AS_STRING(key), kn)
    w += kn
    w += fb_put_varint(w, <uint32_t>vn)
    memcpy(w, PyBytes_AS_STRING(value), vn)
    return w + vn


# -- the block made last ------------------------------------------------------
#
# A publisher mostly sends the same headers again (a content type, a
# source, a tenant): often the very same dict, or a new dict of the same
# str objects.  The encoder keeps the last block it made from a plain dict
# with the objects it was made of (owned, so none can be freed and another
# take its address): a dict that holds those same objects, in that order,
# gets that block back after a pointer compare per header.  str and bytes
# are immutable, so the same objects are the same bytes.  (Encoding runs
# with the GIL held and releases it nowhere: one table for all threads.)

cdef enum:
    _EM_PAIRS = 8               # a block of more headers (or over FB_HEADERS_AGAIN_MAX bytes) is not kept

cdef PyObject *_em_objs[2 * _EM_PAIRS]
cdef Py_ssize_t _em_n = 0       # pairs in _em_objs
cdef bytes _em_block = None


cdef inline bytes _encoded_before(dict d):
    """The block made last, if ``d`` holds exactly its objects; else None."""
    if _em_block is None or PyDict_GET_SIZE(d) != _em_n:
        return None
    cdef Py_ssize_t pos = 0, i = 0
    cdef PyObject *k
    cdef PyObject *v
    while PyDict_Next(d, &pos, &k, &v):
        if k != _em_objs[i] or v != _em_objs[i + 1]:
            return None
        i += 2
    return _em_block


cdef void _encoded_now(dict d, bytes block):
    global _em_n, _em_block
    cdef Py_ssize_t pos = 0, i = 0
    cdef PyObject *k
    cdef PyObject *v
    if PyDict_GET_SIZE(d) > _EM_PAIRS:
        return
    for i in range(2 * _em_n):
        Py_XDECREF(_em_objs[i])
    i = 0
    while PyDict_Next(d, &pos, &k, &v):
        Py_INCREF(<object>k)
        Py_INCREF(<object>v)
        _em_objs[i] = k
        _em_objs[i + 1] = v
        i += 2
    _em_n = i // 2
    _em_block = block


cdef bytes _encode_headers(object headers, bytes reply_to=None, bytes hold=None):
    if headers is None:
        if reply_to is None:
            return None
        headers = {}
    cdef dict d
    cdef bytes again
    if PyDict_CheckExact(headers) or type(headers) is Headers:     # (a received message's, sent on)
        d = <dict>headers
        if reply_to is None:
            again = _encoded_before(d)
            if again is not None:
                return again
    else:
        d = _checked_headers(headers)
    cdef Py_ssize_t pos = 0, kn, vn, total = 0
    cdef PyObject *k
    cdef PyObject *v
    cdef const char *kp
    cdef const char *vp
    # Pass 1: every name and value usable in place (else the slow path
    # converts them, or says what is wrong), and the block's size.
    while PyDict_Next(d, &pos, &k, &v):
        if not PyUnicode_CheckExact(<object>k) or not _header_part(<object>v, &vp, &vn):
            return _encode_headers(_checked_headers(d), reply_to, hold) if d is headers else _raise_headers(d)
        _header_part(<object>k, &kp, &kn)
        if kn == 0:
            raise ValueError("a header name must not be empty")
        if kp[0] == b':':
            raise ValueError(_RESERVED.format(<object>k))
        if kn > UINT32_MAX or vn > UINT32_MAX:
            raise ValueError(f"header {<object>k!r} is over 4 GiB")
        total += <Py_ssize_t>(fb_varint_len(<uint32_t>kn) + fb_varint_len(<uint32_t>vn)) + kn + vn
    if reply_to is not None:
        # A request's reply channel: the block's first header, where a
        # router looks for it (fb_record_reply_to).
        vn = PyBytes_GET_SIZE(reply_to)
        if vn > UINT32_MAX:
            raise ValueError("a reply channel is over 4 GiB")
        total += <Py_ssize_t>(1 + fb_varint_len(<uint32_t>vn)) + PyBytes_GET_SIZE(_REPLY_TO) + vn
        if hold is not None:
            total += 2 + PyBytes_GET_SIZE(_HOLD) + PyBytes_GET_SIZE(hold)    # (a value of 1 to 10 digits)
    if total == 0:
        return None
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char *w = <unsigned char *>PyBytes_AS_STRING_MUT(out)
    if reply_to is not None:
        w = _put_header(w, _REPLY_TO, reply_to)
        if hold is not None:
            w = _put_header(w, _HOLD, hold)
    pos = 0
    while PyDict_Next(d, &pos, &k, &v):
        _header_part(<object>k, &kp, &kn)
        _header_part(<object>v, &vp, &vn)
        w += fb_put_varint(w, <uint32_t>kn)
        memcpy(w, kp, kn)
        w += kn
        w += fb_put_varint(w, <uint32_t>vn)
        memcpy(w, vp, vn)
        w += vn
    if reply_to is None and d is headers and total <= FB_HEADERS_AGAIN_MAX:
        _encoded_now(d, out)          # (a large block is not kept alive for a next time)
    return out


cdef bytes _raise_headers(dict d):
    # (A plain dict the slow path made holds only str names and str/bytes
    # values: never here.)
    _checked_headers(d)
    raise TypeError("headers must be a mapping of str to str or bytes")


# -- decoded names ---------------------------------------------------------

cdef PyObject *_hk_slots[_TC_SLOTS]     # str objects made for names, by _tc_slot


cdef object _header_name(const unsigned char *p, uint32_t n):
    """The str of a header name: the one made before for the same bytes
    when it is in the table."""
    cdef Py_ssize_t have
    cdef const char *u
    cdef uint32_t slot
    cdef PyObject *o
    if n > _TC_MAX_LEN:
        return PyUnicode_DecodeUTF8(<const char *>p, n, "surrogateescape")
    slot = _tc_slot(p, n)
    o = _hk_slots[slot]
    if o is not NULL:
        u = PyUnicode_AsUTF8AndSize(<object>o, &have)
        if have == n and memcmp(u, p, n) == 0:
            return <object>o
    try:
        s = PyUnicode_DecodeUTF8(<const char *>p, n, NULL)
    except UnicodeDecodeError:          # not UTF-8: kept as it is, not cached
        return PyUnicode_DecodeUTF8(<const char *>p, n, "surrogateescape")
    Py_INCREF(s)
    _hk_slots[slot] = <PyObject *>s
    Py_XDECREF(o)
    return s


cdef object _text_or_bytes(const char *p, Py_ssize_t n):
    try:
        return PyUnicode_DecodeUTF8(p, n, NULL)
    except UnicodeDecodeError:             # binary: it stays bytes (nothing is lost, nothing raises)
        return PyBytes_FromStringAndSize(p, n)


cdef object _headers_dict(const unsigned char *block, uint32_t n, bint utf8, bint protocol=True):
    if block is NULL or n == 0:
        return None
    cdef Headers out = Headers.__new__(Headers)
    cdef const unsigned char *p = block
    cdef const unsigned char *end = block + n
    cdef fb_header h
    cdef object value
    while fb_headers_next(&p, end, &h):
        if not protocol and h.key[0] == b':':
            continue                       # (a message dict says them its own way: reply_to)
        if utf8:
            value = _text_or_bytes(<const char *>h.value, h.value_len)
        else:
            value = PyBytes_FromStringAndSize(<const char *>h.value, h.value_len)
        PyDict_SetItem(out, _header_name(h.key, h.key_len), value)   # (dict's own: Headers refuses users only)
    PyObject_GC_UnTrack(<void *>out)       # only str and bytes inside: no cycles
    return out if out or protocol else None


cdef enum:
    # A block longer than this is compared only by where it lies: the same
    # bytes of the batch (a record that repeats the block before, on the
    # wire).  (Comparing a long block with memcmp would cost what building
    # it does.)
    _HM_COMPARE_MAX = 512


cdef object _headers_memo(_header_memo *m, const unsigned char *block, uint32_t n, bint utf8, bint protocol):
    if block is NULL or n == 0:
        return None
    cdef object d
    if m.made is not NULL and n == m.n and (block == m.block or (n <= _HM_COMPARE_MAX and memcmp(block, m.block, n) == 0)):
        return <object>m.made              # (read-only: every record that repeats it shares it)
    d = _headers_dict(block, n, utf8, protocol)
    Py_INCREF(d)
    Py_XDECREF(m.made)
    m.made = <PyObject *>d
    m.block = block
    m.n = n
    return d


cdef void _hm_clear(_header_memo *m) noexcept:
    Py_XDECREF(m.made)
    m.made = NULL
