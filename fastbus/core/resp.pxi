# RESP: reply scanning, the pipeline pump and cluster key slots (csrc/fb_resp.h).
# Part of fastbus/_core.pyx (included there).

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


def key_slot(key) -> int:
    """The Redis Cluster hash slot of a key (bytes or str), hash tags included."""
    cdef bytes k = _as_bytes(key)
    return fb_resp_key_slot(PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k))


cdef class RespPump:
    """Streams a Redis pipeline over a socket with the GIL released (see
    fb_resp.h): ``pump(fd, data, need, timeout)`` writes ``data`` while
    reading replies and returns once it is all written and ``need`` more
    replies are consumed; replies beyond that wait in this object for the
    next call.  Returns ``(replies, int_sum, error_indexes, first_error)``
    and keeps it in ``last``.  A timeout, a closed peer, a socket error or
    bytes that are not RESP raise (TimeoutError, ConnectionResetError,
    OSError, BatchError); ``last`` then counts the replies read before it.
    POSIX sockets only."""

    def __cinit__(self):
        fb_resp_reader_init(&self._rd)

    def __dealloc__(self):
        fb_resp_reader_destroy(&self._rd)

    def reset(self) -> None:
        """Forget buffered bytes (a new connection)."""
        fb_resp_reader_reset(&self._rd)

    def pump(self, int fd, data, size_t need, double timeout) -> tuple:
        """Write ``data`` (None: nothing) and read until ``need`` more
        replies are in, at most ``timeout`` seconds (< 0: no limit)."""
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
        self.last = (0, 0, [], None)
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
            self.last = (t.replies, t.int_sum, errs, first)
            if rc != FB_OK:
                _raise(rc, "redis pipeline", err)
            return self.last
        finally:
            PyMem_Free(idx)
            if have_view:
                PyBuffer_Release(&view)
