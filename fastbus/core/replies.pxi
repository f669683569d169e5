# Requests waiting for their replies, matched by id in C (csrc/fb_replies.h).
# Part of fastbus/_core.pyx (included there).

#: Replies.wait()'s and Replies.close()'s states (fb_replies.h).
REPLY_WAITING = FB_REPLY_WAITING
REPLY_DONE = FB_REPLY_DONE
REPLY_NO_RESPONDERS = FB_REPLY_NO_RESPONDERS
REPLY_TIMEOUT = FB_REPLY_TIMEOUT
REPLY_LEAD = FB_REPLY_LEAD
REPLY_CLOSED = FB_REPLY_CLOSED


cdef class Replies:
    """A client's requests waiting for their replies.  A request's reply
    channel is ``prefix`` followed by its id in decimal; :meth:`take` hands
    a received batch over, and every record on such a channel completes
    the request with that id (the rest is counted and dropped).  Threads
    wait in :meth:`wait` without the interpreter lock; a request opened
    ``async_`` is listed by :meth:`done` instead, and the descriptor given
    to :meth:`set_wake_fd` is written when one completes."""

    def __cinit__(self, bytes prefix not None, uint32_t max_pending=65536):
        self._t = fb_replies_new(PyBytes_AS_STRING(prefix), <size_t>PyBytes_GET_SIZE(prefix), max_pending)
        if self._t is NULL:
            raise MemoryError()
        self.prefix = prefix

    def __dealloc__(self):
        if self._t is not NULL:
            fb_replies_free(self._t)
            self._t = NULL

    def set_wake_fd(self, int fd) -> None:
        fb_replies_set_wake_fd(self._t, fd)

    def open(self, bint async_=False) -> int:
        """A new request's id; OverflowError when max_pending wait already."""
        cdef uint64_t rid = 0
        rc = fb_replies_open(self._t, async_, &rid)
        if rc == FB_ELIMIT:
            raise OverflowError("too many requests wait for their replies on this client")
        _check(rc, "open")
        return rid

    def wait(self, uint64_t rid, double timeout) -> int:
        """Wait (no interpreter lock) until request ``rid`` completes
        (REPLY_DONE, REPLY_NO_RESPONDERS), ``timeout`` seconds pass
        (REPLY_TIMEOUT; < 0: no limit), the caller must read the inbox
        because nobody does (REPLY_LEAD: call unlead() when it stops), or
        the inbox closed (REPLY_CLOSED)."""
        cdef uint64_t deadline = UINT64_MAX if timeout < 0 else fb_now_ns() + <uint64_t>(timeout * 1e9)
        cdef int rc
        with nogil:
            rc = fb_replies_wait(self._t, rid, deadline)
        _check(rc, "wait")
        return rc

    def unlead(self) -> None:
        """The caller stops reading the inbox: another waiter is asked to."""
        fb_replies_unlead(self._t)

    def state(self, uint64_t rid) -> int:
        rc = fb_replies_state(self._t, rid)
        _check(rc, "state")
        return rc

    def close(self, uint64_t rid, bint utf8=False, bint protocol=False) -> tuple:
        """Forget request ``rid``: ``(state, headers or None, payload or
        None)``: the reply, if it came; its headers a dict as a message's
        (the protocol's own left out unless ``protocol``: a broker's
        ``:status``; values str where UTF-8 with ``utf8``)."""
        cdef fb_reply r
        r.buf = NULL
        rc = fb_replies_close(self._t, rid, &r)
        _check(rc, "close")
        if r.buf is NULL:
            return rc, None, None
        try:
            block = _headers_dict(r.buf, r.headers_len, utf8, protocol) if r.headers_len else None
            payload = PyBytes_FromStringAndSize(<const char *>r.buf + r.headers_len, r.len - r.headers_len)
        finally:
            fb_free(r.buf)
        return rc, block, payload

    def take(self, batch) -> int:
        """Match a received batch's records to the waiting requests: how
        many completed one."""
        cdef Py_buffer view
        cdef int rc
        PyObject_GetBuffer(batch, &view, PyBUF_SIMPLE)
        try:
            with nogil:
                rc = fb_replies_take(self._t, view.buf, <size_t>view.len)
        finally:
            PyBuffer_Release(&view)
        _check(rc, "take")
        return rc

    def done(self) -> list:
        """The async requests completed since the last call."""
        cdef uint64_t ids[256]
        cdef size_t n, i
        out = []
        while True:
            n = fb_replies_done(self._t, ids, 256)
            for i in range(n):
                out.append(ids[i])
            if n < 256:
                return out

    def close_all(self) -> None:
        """The inbox is gone: every waiter returns REPLY_CLOSED."""
        fb_replies_close_all(self._t)

    def stats(self) -> dict:
        """opened, replied, no_responders, timed_out, unmatched (cumulative)."""
        cdef fb_replies_stats s
        fb_replies_get_stats(self._t, &s)
        return {"opened": s.opened, "replied": s.replied, "no_responders": s.no_responders,
                "timed_out": s.timed_out, "unmatched": s.unmatched}
