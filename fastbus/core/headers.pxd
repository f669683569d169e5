# Message headers: a dict <-> a header block (fb_batch.h, FB_BATCH_F_HEADERS).
# Included by fastbus/_core.pxd: ``from fastbus._core cimport _encode_headers``.
from cpython.object cimport PyObject
from libc.stdint cimport uint32_t

# A headers mapping as a block to append (fb_outbox_append_h); None for
# None or an empty mapping (a record without headers).  reply_to: a
# request's reply channel, the block's first header (:reply-to); names
# beginning with ':' are the protocol's, refused from users.  TypeError or
# ValueError, with what is wrong, for anything else publish() refuses.
# hold: with reply_to, a request to a held group, the :hold header after
# it (its value: the capacity, decimal).
cdef bytes _encode_headers(object headers, bytes reply_to=*, bytes hold=*)

# A checked block (fb_record.headers) as a Headers (a read-only dict,
# headers.pxi): str keys; bytes values, with utf8 str where a value is
# UTF-8 (bytes where not).  None for a record without headers.
# protocol=False leaves the protocol's (':') headers out, and gives None
# if nothing else is left.
cdef object _headers_dict(const unsigned char *block, uint32_t n, bint utf8, bint protocol=*)

# _headers_dict for a batch's records in turn: a record whose block is the
# one before it, byte for byte, gets the very Headers made for that one
# (a stream's records mostly carry the same headers; sharing one costs a
# reference, where a copy of a small dict cost a third of building it).  A decoder keeps one memo per batch, zeroed
# before the first record, and clears it (_hm_clear) after the last; the
# block pointers it holds are the batch's, so it must not outlive the batch.
cdef struct _header_memo:
    const unsigned char *block
    uint32_t n
    PyObject *made              # (owned) the dict made for block, or None

cdef object _headers_memo(_header_memo *m, const unsigned char *block, uint32_t n, bint utf8, bint protocol)
cdef void _hm_clear(_header_memo *m) noexcept

# decode_responses's rule for what is read: the str of UTF-8 bytes, the
# bytes themselves where they are not UTF-8 (nothing is lost, nothing raises).
cdef object _text_or_bytes(const char *p, Py_ssize_t n)
