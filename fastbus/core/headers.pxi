# Message headers (csrc/fb_batch.h: a record's header block).
# Part of fastbus/_core.pyx (included there).
#
# A block is pairs `key_len varint (>= 1), key, value_len varint, value`.
# Keys are str (UTF-8 on the wire); values str (UTF-8) or bytes; the
# mapping's order is kept.  What a block may hold in all is bounded by the
# broker's max_payload, which counts payload and headers together.

from cpython.unicode cimport PyUnicode_DecodeUTF8


cdef bytes _encode_headers(object headers):
    if headers is None:
        return None
    try:
        items = headers.items()
    except AttributeError:
        raise TypeError(f"headers must be a mapping of str to str or bytes, not {type(headers).__name__}") from None
    cdef list parts = []
    cdef Py_ssize_t total = 0
    cdef bytes k, v
    cdef unsigned char lens[FB_VARINT_MAX]
    for key, value in items:
        if not isinstance(key, str):
            raise TypeError(f"a header name must be a str, not {type(key).__name__} ({key!r:.40})")
        if not key:
            raise ValueError("a header name must not be empty")
        k = (<str>key).encode("utf-8")
        if isinstance(value, str):
            v = (<str>value).encode("utf-8")
        elif isinstance(value, (bytes, bytearray, memoryview)):
            v = bytes(value)
        else:
            raise TypeError(f"header {key!r}: a value must be str or bytes, not {type(value).__name__}")
        if PyBytes_GET_SIZE(k) > UINT32_MAX or PyBytes_GET_SIZE(v) > UINT32_MAX:
            raise ValueError(f"header {key!r} is over 4 GiB")
        parts.append(PyBytes_FromStringAndSize(<char *>lens, fb_put_varint(lens, <uint32_t>PyBytes_GET_SIZE(k))))
        parts.append(k)
        parts.append(PyBytes_FromStringAndSize(<char *>lens, fb_put_varint(lens, <uint32_t>PyBytes_GET_SIZE(v))))
        parts.append(v)
    if not parts:
        return None
    return b"".join(parts)


cdef object _headers_dict(const unsigned char *block, uint32_t n, bint utf8):
    if block is NULL or n == 0:
        return None
    cdef dict out = {}
    cdef const unsigned char *p = block
    cdef const unsigned char *end = block + n
    cdef fb_header h
    while fb_headers_next(&p, end, &h):
        key = PyUnicode_DecodeUTF8(<const char *>h.key, h.key_len, "surrogateescape")
        if utf8:
            try:
                out[key] = PyUnicode_DecodeUTF8(<const char *>h.value, h.value_len, NULL)
            except UnicodeDecodeError:     # binary: it stays bytes (nothing is lost, nothing raises)
                out[key] = PyBytes_FromStringAndSize(<const char *>h.value, h.value_len)
        else:
            out[key] = PyBytes_FromStringAndSize(<const char *>h.value, h.value_len)
    return out
