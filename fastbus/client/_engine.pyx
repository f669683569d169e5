# cython: language_level=3, boundscheck=False, wraparound=False
"""The client's native engine: what moves a message while no user thread
is inside fastbus, in threads that never take the interpreter lock.

(This file is over 700 lines because it is the one extension module of the
client's native engine, as uvloop is one: thin bindings of fb_zmtp
(``Stream``), fb_slock (``SessionLock``), fb_sender (``Sender``), fb_react
(``Reactions``) and fb_reader (``Reader``), which share the libzmq calls
bound once by ``require()``.)

A Python thread that has work for a connection (the client's keeper, a
reader of a PubSub) must first get the interpreter lock, which a busy user
thread holds for up to the switch interval (5 ms by default): a message
that waits for such a thread has that in its latency.  The engine has:

* ``SessionLock``: the lock of one connection, as Python's
  ``threading.Lock`` (the sessions take it as before), which a native
  thread can also hold without the interpreter lock (csrc/fb_slock.h).
* ``Sender``: a native thread per publishing connection that sends a
  burst's batch: woken by its first message, it sends what gathered by the
  time it has the connection, whatever the publishing thread does next
  (csrc/fb_sender.h); lease pings too.  What it cannot do (control frames
  waiting for room) it hands back to the keeper.
* ``Reader``: a native thread per subscribing connection that takes what
  arrives off the socket while no user thread reads (csrc/fb_reader.h), so
  a subscriber busy in Python between two reads never holds the broker
  back; the next read takes the messages from it, in order.
* ``Stream``: a connection the calling thread writes and reads itself, ZMTP
  without libzmq's I/O thread (csrc/fb_zmtp.h): it keeps what the broker
  has not acknowledged and sends it again after a cut, and looks its host
  name up again after each loss.  Sessions use it for tcp:// and ipc://
  without CURVE.
* ``send_frames``/``recv_frames``: a Python thread's own sends and reads,
  without letting go of the interpreter lock (pyzmq's do, and getting it
  back can take a switch interval, with the connection's lock held
  meanwhile, and a native thread waiting for it).

A CURVE connection is a pyzmq socket, which the engine calls through the
functions of the libzmq that pyzmq loaded (``fastbus._libzmq``), bound
once by ``require()`` when the first session opens; where they cannot be
found, no session opens (``DataPlaneUnavailable``, as the broker), since
the engine is the only path a session has.
"""

from libc.stdint cimport int64_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memset, strerror
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE

import time

import zmq

from fastbus._core cimport Outbox, Replies
from fastbus.includes.fb_replies cimport fb_replies_set_read_elsewhere
from fastbus.includes.fb_batch cimport fb_batch_header
from fastbus._publisher cimport Publisher
from fastbus.includes.fb_common cimport fb_now_ns
from fastbus.includes.fb_protocol cimport FB_CMD_ACK_S, FB_CMD_DATA_S, FB_CMD_PUB_S, FB_CMD_TOOK_S, FB_CMD_WANT_S
from fastbus.includes.fb_react cimport (FB_REACT_ACK, FB_REACT_FRAMES_MAX, FB_REACT_OWNER, FB_REACT_TOKEN_MAX,
                                        fb_react, fb_react_lease_ping, fb_react_message, fb_react_ping_if_due,
                                        fb_react_set_instance)
from fastbus.includes.fb_reader cimport (fb_reader, fb_zmq_recv_calls, fb_reader_item, fb_reader_pop,
                                         fb_reader_release, fb_reader_start, fb_reader_stop, fb_reader_wake,
                                         fb_zmq_msg, fb_reader_owner_enter, fb_reader_owner_leave)
from fastbus.includes.fb_sender cimport (fb_sender, fb_sender_start, fb_sender_stop,
                                         fb_sender_send_now, fb_sender_wake)
from fastbus.includes.fb_zmtp cimport (FB_ZMTP_FD, fb_zmtp, fb_zmtp_buffered, fb_zmtp_close, fb_zmtp_connected,
                                       fb_zmtp_get_stats, fb_zmtp_set_host, fb_zmtp_address,
                                       fb_zmtp_set_reconnect_message, fb_zmtp_set_resend, fb_zmtp_acked,
                                       fb_zmtp_resume, fb_zmtp_resend_state, fb_zmtp_kept_each, fb_zmtp_take_lost,
                                       FB_ZMTP_RESUMED, FB_ZMTP_FRESH, FB_ZMTP_FRESH_DROP, fb_zmtp_getsockopt,
                                       fb_zmtp_msg_close, fb_zmtp_msg_data, fb_zmtp_msg_init, fb_zmtp_msg_more,
                                       fb_zmtp_msg_recv, fb_zmtp_msg_size, fb_zmtp_open, fb_zmtp_options,
                                       fb_zmtp_pending, fb_zmtp_send, fb_zmtp_stats)
from fastbus.includes.fb_slock cimport (fb_slock, fb_slock_destroy, fb_slock_held, fb_slock_init,
                                        fb_slock_release, fb_slock_try, fb_slock_wait)

cdef extern from *:
    """
    static inline int fbe_load_int(int *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static inline void fbe_store_int(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    static inline int fbe_exchange_int(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
    static inline unsigned long long fbe_load_u64(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static inline void fbe_store_u64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    static inline void fbe_store_ptr(void **p, void *v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    """
    int fbe_load_int(int *p) nogil
    void fbe_store_int(int *p, int v) nogil
    int fbe_exchange_int(int *p, int v) nogil
    unsigned long long fbe_load_u64(uint64_t *p) nogil
    void fbe_store_u64(uint64_t *p, uint64_t v) nogil
    void fbe_store_ptr(void **p, void *v) nogil

ctypedef int (*f_send)(void *s, const void *buf, size_t len, int flags) noexcept nogil
ctypedef int (*f_getsockopt)(void *s, int option, void *value, size_t *len) noexcept nogil
ctypedef int (*f_msg_init)(fb_zmq_msg *msg) noexcept nogil
ctypedef int (*f_msg_recv)(fb_zmq_msg *msg, void *s, int flags) noexcept nogil
ctypedef void *(*f_msg_data)(fb_zmq_msg *msg) noexcept nogil
ctypedef size_t (*f_msg_size)(const fb_zmq_msg *msg) noexcept nogil
ctypedef int (*f_msg_more)(const fb_zmq_msg *msg) noexcept nogil
ctypedef int (*f_msg_close)(fb_zmq_msg *msg) noexcept nogil

#: The libzmq functions the engine calls.
FUNCTIONS = ("zmq_send", "zmq_getsockopt", "zmq_msg_init", "zmq_msg_recv", "zmq_msg_data", "zmq_msg_size",
             "zmq_msg_more", "zmq_msg_close")

cdef int _zmtp_pending(void *z) noexcept nogil:
    return fb_zmtp_pending(<fb_zmtp *>z)


# The calls of a connection, by kind: a pyzmq socket's (the libzmq that
# pyzmq loaded, bound by require()) or a Stream's (csrc/fb_zmtp.h, the
# same signatures).  The native threads and send_frames/recv_frames use
# whichever their socket's are (_calls_of).
cdef fb_zmq_recv_calls _LIBZMQ
cdef fb_zmq_recv_calls _ZMTP
_ZMTP.msg_init = fb_zmtp_msg_init
_ZMTP.msg_recv = fb_zmtp_msg_recv
_ZMTP.msg_data = fb_zmtp_msg_data
_ZMTP.msg_size = fb_zmtp_msg_size
_ZMTP.msg_more = fb_zmtp_msg_more
_ZMTP.msg_close = fb_zmtp_msg_close
_ZMTP.getsockopt = fb_zmtp_getsockopt
_ZMTP.send = fb_zmtp_send
_ZMTP.pending = _zmtp_pending             # (level-triggered: csrc/fb_reader.h; libzmq's is NULL)
cdef bint _found = False


def require() -> None:
    """Bind the engine to the libzmq that pyzmq loaded (``fastbus._libzmq``),
    once; every session opens through it.  A process where that library
    cannot be found gets :class:`fastbus.errors.DataPlaneUnavailable`,
    which says what to install: there is no slower path that would keep
    nothing for a cut."""
    global _found
    if _found:
        return
    from fastbus._libzmq import functions
    from fastbus.errors import DataPlaneUnavailable
    addresses = functions(FUNCTIONS)
    if addresses is None:
        raise DataPlaneUnavailable(
            f"fastbus's client calls libzmq from C, through the library pyzmq loaded, and could not find it "
            f"(pyzmq {zmq.__version__}, libzmq {zmq.zmq_version()}); "
            f"install pyzmq's own wheel (pip install --force-reinstall pyzmq)")
    _LIBZMQ.send = <f_send><uintptr_t>addresses["zmq_send"]
    _LIBZMQ.getsockopt = <f_getsockopt><uintptr_t>addresses["zmq_getsockopt"]
    _LIBZMQ.msg_init = <f_msg_init><uintptr_t>addresses["zmq_msg_init"]
    _LIBZMQ.msg_recv = <f_msg_recv><uintptr_t>addresses["zmq_msg_recv"]
    _LIBZMQ.msg_data = <f_msg_data><uintptr_t>addresses["zmq_msg_data"]
    _LIBZMQ.msg_size = <f_msg_size><uintptr_t>addresses["zmq_msg_size"]
    _LIBZMQ.msg_more = <f_msg_more><uintptr_t>addresses["zmq_msg_more"]
    _LIBZMQ.msg_close = <f_msg_close><uintptr_t>addresses["zmq_msg_close"]
    _found = True


cdef extern from "<errno.h>":
    int errno
    enum: EAGAIN

cdef enum:
    Z_DONTWAIT = 1
    Z_SNDMORE = 2
    Z_EVENTS = 15
    Z_POLLIN = 1
    Z_POLLOUT = 2


cdef inline const fb_zmq_recv_calls *_calls_of(sock, void **handle) except NULL:
    """The calls of ``sock`` (a Stream or a pyzmq socket) and its handle;
    ENOTSOCK once it is closed."""
    if type(sock) is Stream:
        handle[0] = (<Stream>sock)._z
        if handle[0] == NULL:
            raise zmq.ZMQError(zmq.ENOTSOCK)
        return &_ZMTP
    if sock.closed:
        raise zmq.ZMQError(zmq.ENOTSOCK)
    handle[0] = <void *><uintptr_t>sock.underlying
    return &_LIBZMQ


def send_frames(sock, list frames) -> None:
    """Send a multipart message (bytes-like frames) on a pyzmq socket
    without blocking and without letting go of the interpreter lock;
    ``zmq.Again`` if the socket cannot take it now (then nothing was sent),
    ``zmq.ZMQError`` for any other failure.  Needs ``require()``."""
    cdef void *h
    cdef const fb_zmq_recv_calls *z = _calls_of(sock, &h)
    cdef Py_ssize_t i, n = len(frames)
    cdef Py_buffer view
    cdef int rc, err, ev = 0
    cdef size_t size = sizeof(int)
    if n == 0:
        raise ValueError("a message has at least one frame")
    for i in range(n):
        PyObject_GetBuffer(frames[i], &view, PyBUF_SIMPLE)
        rc = z.send(h, view.buf, <size_t>view.len, Z_DONTWAIT | (Z_SNDMORE if i < n - 1 else 0))
        err = errno
        if rc < 0 and i == 0 and err == EAGAIN:
            # A send reads the socket's commands at most about once a
            # millisecond, so room the other side made since (its "read
            # so far" notice) may not be known yet: a socket sending faster
            # than its high-water mark per millisecond would report full
            # with room to spare.  ZMQ_EVENTS reads them all; then once more.
            if z.getsockopt(h, Z_EVENTS, &ev, &size) == 0 and ev & Z_POLLOUT:
                rc = z.send(h, view.buf, <size_t>view.len, Z_DONTWAIT | (Z_SNDMORE if n > 1 else 0))
                err = errno
        PyBuffer_Release(&view)
        if rc < 0:
            # Once ZeroMQ took a message's first frame it takes the rest.
            if i == 0 and err == EAGAIN:
                raise zmq.Again(err)
            raise zmq.ZMQError(err)


def recv_frames(sock, bint ready=False):
    """The next multipart message on a pyzmq socket as a list of bytes, or
    None if none is waiting (``ready``: a poll just said one is: ZMQ_EVENTS
    is not asked first), without letting go of the interpreter lock.
    ``zmq.ZMQError`` for a failure.  Needs ``require()``."""
    cdef void *h
    cdef const fb_zmq_recv_calls *z = _calls_of(sock, &h)
    cdef int ev = 0, rc, err
    cdef size_t size = sizeof(int)
    cdef fb_zmq_msg m
    cdef list parts = []
    cdef bint more = True
    if not ready:
        if z.getsockopt(h, Z_EVENTS, &ev, &size) != 0:
            raise zmq.ZMQError(errno)
        if not ev & Z_POLLIN:
            return None
    while more:
        z.msg_init(&m)
        rc = z.msg_recv(&m, h, Z_DONTWAIT)
        if rc < 0:
            err = errno
            z.msg_close(&m)
            if not parts and err == EAGAIN:
                return None               # (ZeroMQ delivers a message whole)
            raise zmq.ZMQError(err)
        parts.append(PyBytes_FromStringAndSize(<char *>z.msg_data(&m), <Py_ssize_t>z.msg_size(&m)))
        more = z.msg_more(&m)
        z.msg_close(&m)
    return parts


def events(sock) -> int:
    """ZMQ_EVENTS of a Stream or a pyzmq socket (POLLIN: a message can be
    read now; POLLOUT: one can be sent)."""
    cdef void *h
    cdef const fb_zmq_recv_calls *z = _calls_of(sock, &h)
    cdef int ev = 0
    cdef size_t size = sizeof(int)
    if z.getsockopt(h, Z_EVENTS, &ev, &size) != 0:
        raise zmq.ZMQError(errno)
    return ev


cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    enum: POLLIN


cdef struct _kept_count:
    unsigned char command
    uint64_t total


cdef int _count_records(void *arg, const unsigned char *first, size_t first_len,
                        const unsigned char *last, size_t last_len) noexcept nogil:
    """fb_zmtp_kept_each: the records of a kept message of c.command."""
    cdef _kept_count *c = <_kept_count *>arg
    cdef uint32_t count = 0
    if first_len == 1 and first[0] == c.command and fb_batch_header(last, last_len, &count, NULL) >= 0:
        c.total += count
    return 0


cdef class Stream:
    """A DEALER connection to a broker that the calling thread writes and
    reads itself (ZMTP over a plain TCP or Unix socket, csrc/fb_zmtp.h): no
    libzmq I/O thread between a caller and the kernel, so a message crosses
    no thread hand-over in this process.  The broker sees a ZeroMQ DEALER.

    It has the part of a pyzmq socket's interface the client's sessions use:
    options set before ``connect()`` (``sndhwm``, ``sndbuf``, ``rcvbuf``,
    ``reconnect_ivl``, ``reconnect_ivl_max`` in ms, ``tcp_keepalive``,
    ``maxmsgsize``, ``linger`` and ``sndtimeo`` in ms; ``rcvhwm`` is
    accepted and means nothing: nothing is read ahead of the caller),
    ``FD`` and ``fileno()`` (zmq.zmq_poll polls it as a descriptor: readable
    while the kernel holds input for it; ``buffered()`` says whether whole
    messages were read into it already), ``poll()``, ``send_multipart()``,
    ``recv_multipart()``, ``get(zmq.EVENTS)``, ``close()``, ``closed``;
    send_frames/recv_frames and the native threads take it as they take a
    pyzmq socket.  ``address``: the peer's struct sockaddr connected to
    now, as bytes (fastbus.endpoints.sockaddr).  Given ``host``, the name
    ``address`` was looked up from, the connection looks it up again after
    each loss (off the caller's thread) and follows it where it moved."""

    cdef fb_zmtp *_z
    cdef bytes _address
    cdef str _host
    cdef readonly str endpoint
    cdef readonly int FD
    cdef public int sndhwm, sndbuf, rcvbuf, rcvhwm, reconnect_ivl, reconnect_ivl_max, tcp_keepalive
    cdef public int linger, sndtimeo
    cdef public long long maxmsgsize
    cdef bint _opened
    cdef bint _resend

    def __cinit__(self, bytes address not None, str host=None):
        self._address = address
        self._host = host
        self.endpoint = ""
        self.FD = -1
        self.sndhwm = 1000
        self.rcvhwm = 1000
        self.reconnect_ivl = 100
        self.reconnect_ivl_max = 0
        self.tcp_keepalive = 0
        self.linger = -1
        self.sndtimeo = -1
        self.maxmsgsize = 256 * 1024 * 1024

    def connect(self, str endpoint) -> None:
        """Start connecting (the address given at construction; ``endpoint``
        is its name, for messages); sends queue until the handshake."""
        if self._opened:
            raise zmq.ZMQError(zmq.EINVAL, "a Stream connects once")
        cdef fb_zmtp_options o
        memset(&o, 0, sizeof(o))
        o.sndhwm = max(1, self.sndhwm)
        o.sndbuf = max(0, self.sndbuf)
        o.rcvbuf = max(0, self.rcvbuf)
        o.keepalive = self.tcp_keepalive > 0
        o.max_msg_bytes = <uint64_t>self.maxmsgsize if self.maxmsgsize > 0 else (<uint64_t>1 << 62)
        o.reconnect_ivl_ns = <uint64_t>max(1, self.reconnect_ivl) * 1000000
        o.reconnect_ivl_max_ns = <uint64_t>max(self.reconnect_ivl, self.reconnect_ivl_max) * 1000000
        cdef int err = 0, fd = -1
        cdef size_t size = sizeof(int)
        self._z = fb_zmtp_open(PyBytes_AS_STRING(self._address), <size_t>PyBytes_GET_SIZE(self._address), &o, &err)
        if self._z == NULL:
            raise zmq.ZMQError(err, f"cannot connect to {endpoint}: {strerror(err).decode()}")
        self._opened = True
        self.endpoint = endpoint
        if self._host and fb_zmtp_set_host(self._z, self._host.encode("idna")) < 0:
            raise MemoryError()
        fb_zmtp_getsockopt(self._z, FB_ZMTP_FD, &fd, &size)
        self.FD = fd

    def __dealloc__(self):
        if self._z != NULL:
            fb_zmtp_close(self._z, 0)
            self._z = NULL

    @property
    def closed(self) -> bool:
        return self._z == NULL

    @property
    def address(self) -> bytes:
        """The struct sockaddr connected to now (it changes when the host
        name given moved)."""
        cdef unsigned char buf[128]
        cdef size_t n = sizeof(buf)
        if self._z == NULL or fb_zmtp_address(self._z, buf, &n) < 0:
            return self._address
        return PyBytes_FromStringAndSize(<char *>buf, <Py_ssize_t>n)

    def buffered(self) -> bool:
        """Is a whole message here that its descriptor does not show (read
        into the connection, not yet received)?  No syscall."""
        return self._z != NULL and fb_zmtp_buffered(self._z)

    def pending(self) -> bool:
        """May a receive find a message without waiting (one is buffered,
        or the last read filled its buffer: the kernel may hold more)?
        False: the kernel was drained at the last read, and the descriptor
        says when more comes.  No syscall."""
        return self._z != NULL and fb_zmtp_pending(self._z)

    def set_resend(self, bytes commands not None, Py_ssize_t max_bytes) -> None:
        """Keep each message whose first frame begins with one of
        ``commands`` until the broker acknowledges it (TOOK), at most
        ``max_bytes`` of them; after a lost connection, hold them until
        ``resume()`` (csrc/fb_zmtp.h resend).  ``b""`` turns it off."""
        if self._z == NULL:
            raise ValueError("a closed Stream")
        if fb_zmtp_set_resend(self._z, <const unsigned char *>PyBytes_AS_STRING(commands), PyBytes_GET_SIZE(commands),
                              <size_t>max(max_bytes, 0)) < 0:
            raise ValueError("set_resend: up to 8 commands, before anything was counted")
        self._resend = PyBytes_GET_SIZE(commands) > 0

    def acked(self, uint64_t n) -> None:
        """The broker took this many of the counted messages."""
        if self._z != NULL:
            fb_zmtp_acked(self._z, n)

    def resume(self, uint64_t received, str how) -> int:
        """What the broker's WELCOME says: ``how`` "resumed" (it holds
        ``received`` of them: the rest goes again), "fresh" (a new session:
        what never went goes) or "fresh-drop" (nothing kept goes).  The
        messages dropped as sent on a lost connection: may be lost."""
        cdef int h = FB_ZMTP_RESUMED if how == "resumed" else FB_ZMTP_FRESH if how == "fresh" else FB_ZMTP_FRESH_DROP
        if self._z == NULL:
            return 0
        return fb_zmtp_resume(self._z, received, h)

    @property
    def resend_state(self) -> tuple:
        """``(counted, acknowledged, bytes kept, held)``; None without resend."""
        cdef uint64_t counted = 0, acked = 0
        cdef size_t kept = 0
        cdef int held = 0
        if self._z == NULL or not self._resend:
            return None
        fb_zmtp_resend_state(self._z, &counted, &acked, &kept, &held)
        return (counted, acked, kept, bool(held))

    def take_lost(self) -> bool:
        """True once for each connection that was up and went (its reader
        holding the lock): whoever reads the connection says it at once."""
        return self._z != NULL and fb_zmtp_take_lost(self._z) == 1

    def unacknowledged_records(self, bytes command not None) -> int:
        """The records in the batches of ``command`` messages (PUB) kept
        because the broker has not acknowledged them: what a closing
        client could not deliver.  0 without resend."""
        cdef _kept_count c
        if self._z == NULL or not self._resend or PyBytes_GET_SIZE(command) != 1:
            return 0
        c.command = (<const unsigned char *>PyBytes_AS_STRING(command))[0]
        c.total = 0
        fb_zmtp_kept_each(self._z, _count_records, &c)
        return c.total

    def set_reconnect_message(self, list frames not None) -> None:
        """A message (bytes frames, at most 8) sent first on each connection
        made after a lost one (fb_zmtp_set_reconnect_message): the broker
        hears at once that this client is back."""
        cdef const void *data[8]
        cdef size_t lens[8]
        cdef int i, n = len(frames)
        if n > 8 or self._z == NULL:
            raise ValueError("a reconnect message has at most 8 frames, on an open Stream")
        for i in range(n):
            if type(frames[i]) is not bytes:
                raise TypeError("frames are bytes")
            data[i] = PyBytes_AS_STRING(frames[i])
            lens[i] = PyBytes_GET_SIZE(frames[i])
        if fb_zmtp_set_reconnect_message(self._z, data, lens, n) < 0:
            raise MemoryError()

    @property
    def connected(self) -> bool:
        """Is the handshake with the broker done (messages flow)?"""
        return self._z != NULL and fb_zmtp_connected(self._z)

    @property
    def stats(self) -> dict:
        """Counters: handshakes done, connections lost, closed for bad
        input, queued messages dropped with a lost connection, the
        send()/recv() calls made, and the host's lookups after losses
        (done, failed, that moved the address)."""
        cdef fb_zmtp_stats st
        memset(&st, 0, sizeof(st))
        if self._z != NULL:
            fb_zmtp_get_stats(self._z, &st)
        return {"connects": st.connects, "disconnects": st.disconnects, "protocol_errors": st.protocol_errors,
                "dropped_messages": st.dropped_messages, "send_calls": st.syscalls_send,
                "recv_calls": st.syscalls_recv, "lookups": st.lookups, "lookup_failures": st.lookup_failures,
                "address_changes": st.address_changes}

    def fileno(self) -> int:
        if self._z == NULL:
            raise zmq.ZMQError(zmq.ENOTSOCK)
        return self.FD

    @property
    def underlying(self) -> int:
        """The connection's address (an ``fb_zmtp *``), as pyzmq's
        ``Socket.underlying`` is its libzmq handle: for native code that
        drives the connection through csrc/fb_zmtp.h's calls (the broker's
        relay, its upstream link), while this object owns it."""
        if self._z == NULL:
            raise zmq.ZMQError(zmq.ENOTSOCK)
        return <uintptr_t>self._z

    def get(self, int option) -> int:
        if option == Z_EVENTS:
            return events(self)
        if option == FB_ZMTP_FD:
            return self.fileno()
        raise zmq.ZMQError(zmq.EINVAL, f"a Stream has no option {option}")

    def close(self, linger=None) -> None:
        """Close; what is still queued gets up to ``linger`` ms to leave
        (default: the ``linger`` option; -1, as libzmq's default, is taken
        as 1 s here: a close never blocks for ever)."""
        cdef fb_zmtp *z = self._z
        if z == NULL:
            return
        cdef int ms = self.linger if linger is None else int(linger)
        if ms < 0:
            ms = 1000
        self._z = NULL
        with nogil:
            fb_zmtp_close(z, ms)

    def poll(self, timeout=None, int flags=Z_POLLIN) -> int:
        """Wait up to ``timeout`` ms (None or -1: for ever) until ``flags``
        (POLLIN, POLLOUT) can be done; the events that can, or 0."""
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout / 1000.0
        cdef pollfd p
        cdef int ms, ev
        while True:
            ev = events(self) & flags
            if ev:
                return ev
            if deadline is None:
                ms = 1000
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return 0
                ms = min(1000, max(1, int(left * 1000 + 0.999)))
            p.fd = self.FD
            p.events = POLLIN
            p.revents = 0
            with nogil:
                poll(&p, 1, ms)

    def send_multipart(self, msg_parts, int flags=0) -> None:
        """Send a multipart message; without zmq.NOBLOCK, wait up to
        ``sndtimeo`` ms for room (zmq.Again after)."""
        frames = list(msg_parts)
        if flags & Z_DONTWAIT:
            send_frames(self, frames)
            return
        deadline = None if self.sndtimeo < 0 else time.monotonic() + self.sndtimeo / 1000.0
        while True:
            try:
                send_frames(self, frames)
                return
            except zmq.Again:
                left = None if deadline is None else (deadline - time.monotonic()) * 1000
                if left is not None and left <= 0:
                    raise
                self.poll(left, Z_POLLOUT)

    def recv_multipart(self, int flags=0) -> list:
        """The next message's frames (bytes); zmq.Again with zmq.NOBLOCK if
        none is here, else wait for one."""
        while True:
            frames = recv_frames(self)
            if frames is not None:
                return frames
            if flags & Z_DONTWAIT:
                raise zmq.Again(EAGAIN)
            self.poll(None, Z_POLLIN)

    def __repr__(self) -> str:
        state = "closed" if self._z == NULL else ("connected" if fb_zmtp_connected(self._z) else "connecting")
        return f"<fastbus Stream {self.endpoint or '(not connected)'} {state}>"


cdef class SessionLock:
    """The lock of one connection to the broker: ``threading.Lock``'s
    interface (``acquire(blocking=True, timeout=-1)``, ``release()``,
    ``locked()``, a context manager), and a native thread may hold it too.
    A Python thread waits for it with the interpreter lock released."""

    cdef fb_slock _l

    def __cinit__(self):
        cdef int rc = fb_slock_init(&self._l)
        if rc:
            raise OSError(rc, strerror(rc).decode())

    def __dealloc__(self):
        fb_slock_destroy(&self._l)

    def acquire(self, bint blocking=True, double timeout=-1) -> bool:
        if fb_slock_try(&self._l):
            return True
        if not blocking:
            if timeout != -1:
                raise ValueError("can't specify a timeout for a non-blocking call")
            return False
        if timeout < 0 and timeout != -1:
            raise ValueError("timeout value must be a non-negative number")
        cdef int64_t ns = -1 if timeout < 0 else <int64_t>(timeout * 1e9)
        cdef bint got
        with nogil:
            got = fb_slock_wait(&self._l, ns)
        return got

    def release(self) -> None:
        if fb_slock_release(&self._l) < 0:
            raise RuntimeError("release unlocked lock")

    def locked(self) -> bool:
        return fb_slock_held(&self._l)

    def __enter__(self):
        self.acquire()
        return True

    def __exit__(self, *exc):
        self.release()


cdef class Sender:
    """A native thread that sends the batches a publisher's burst left in
    its outbox, on one connection (``sock``, guarded by ``lock``), and hands
    back to its owner (a byte written to ``owner_fd``) what it does not
    send: see csrc/fb_sender.h.  ``wake()`` is the publisher's wake-up.
    With ``reactions`` (the connection's, with a lease) it also sends the
    lease ping the publisher asks for (its ``renew``): their lease_ping."""

    cdef fb_sender _s
    cdef Publisher _pub
    cdef Outbox _outbox
    cdef SessionLock _lock
    cdef object _sock
    cdef bytes _command
    cdef Reactions _reactions

    def __cinit__(self, Publisher publisher not None, SessionLock lock not None, sock, int owner_fd,
                  double linger=0.0, bytes command=FB_CMD_PUB_S[:1], Reactions reactions=None):
        require()
        self._pub = publisher
        self._outbox = publisher.outbox
        self._lock = lock
        self._sock = sock                      # kept open while the thread may use it
        self._command = command
        cdef void *h
        cdef const fb_zmq_recv_calls *z = _calls_of(sock, &h)
        self._s.z.send = z.send
        self._s.z.getsockopt = z.getsockopt
        self._s.z.pending = z.pending
        self._s.sock = h
        self._s.slock = &lock._l
        self._s.outbox = &self._outbox._o
        self._s.outbox_lock = &self._outbox._lock
        self._s.sealed = &publisher._sealed
        self._s.burst = &publisher._burst
        self._s.linger_ns = <uint64_t>(linger * 1e9) if linger > 0 else 0
        self._s.command = PyBytes_AS_STRING(command)
        self._s.command_len = PyBytes_GET_SIZE(command)
        self._s.owner_fd = owner_fd
        if reactions is not None:
            # It renews their view's lease when the publisher asks (wake):
            # csrc/fb_sender.h react, fb_react_lease_ping.
            self._reactions = reactions
            self._s.react = &reactions._x
        cdef int rc = fb_sender_start(&self._s)
        if rc:
            raise OSError(rc, strerror(rc).decode())

    def __dealloc__(self):
        with nogil:
            fb_sender_stop(&self._s)

    def wake(self) -> None:
        """Look at the outbox now (the publisher's call when a batch starts
        in a burst, or fills)."""
        fb_sender_wake(&self._s)

    def send_now(self, bint full) -> None:
        """The publisher's ``send_now`` (see fastbus/_publisher.pyx), in C:
        a batch started on an idle publisher, or filled (``full``), leaves
        from the publishing thread now if the connection is free, else this
        thread sends it (csrc/fb_sender.h fb_sender_send_now).  No Python
        frame, and the interpreter lock kept (it never waits)."""
        if self._s.running:
            fb_sender_send_now(&self._s, full)
        else:
            self._pub.wake()                   # stopped (its session closing): the owner's wake

    def stop(self) -> None:
        """Stop the thread and wait for it (it lets go of the connection
        first).  Call it without holding the connection's lock."""
        with nogil:
            fb_sender_stop(&self._s)

    @property
    def running(self) -> bool:
        return self._s.running

    @property
    def paused(self) -> bool:
        return fbe_load_int(&self._s.paused)

    @paused.setter
    def paused(self, bint value):
        """Flow control: leave sending to the owner (set with the
        connection's lock held)."""
        fbe_store_int(&self._s.paused, value)

    @property
    def owner_first(self) -> bool:
        return fbe_load_int(&self._s.owner_first)

    @owner_first.setter
    def owner_first(self, bint value):
        """Control frames wait to be sent: the owner sends them first, and
        what follows (set with the connection's lock held)."""
        fbe_store_int(&self._s.owner_first, value)

    @property
    def owner_skipped(self) -> bool:
        return fbe_load_int(&self._s.owner_skipped)

    @owner_skipped.setter
    def owner_skipped(self, bint value):
        """The owner found the connection's lock taken and will not watch
        the connection until woken: the thread wakes it when it lets go."""
        fbe_store_int(&self._s.owner_skipped, value)

    def take_handed(self) -> bool:
        """Has the thread handed work back since the last call?"""
        return fbe_exchange_int(&self._s.handed, 0)

    @property
    def sent_messages(self) -> int:
        """Messages this thread sent."""
        return fbe_load_u64(&self._s.sent_messages)

    @property
    def sent_batches(self) -> int:
        return fbe_load_u64(&self._s.sent_batches)

    @property
    def inline_messages(self) -> int:
        """Messages the publishing thread sent through ``send_now``."""
        return fbe_load_u64(&self._s.inline_messages)

    @property
    def inline_batches(self) -> int:
        return fbe_load_u64(&self._s.inline_batches)

    @property
    def full_waits(self) -> int:
        """Times the thread found the socket full and waited for room
        itself (with a reader: see csrc/fb_sender.h)."""
        return fbe_load_u64(&self._s.full_waits)



cdef enum:
    MAX_FRAMES = 16              # frames of one message handed over; more is the owner's protocol error


cdef void _stream_acked(void *sock, uint64_t n) noexcept nogil:
    fb_zmtp_acked(<fb_zmtp *>sock, n)


cdef class Reactions:
    """A connection's reactions to what the broker says that need no
    Python (csrc/fb_react.h): applied by whichever thread read the message,
    the native reader (``Reader(reactions=)``) or a user thread through
    ``take()``, with the connection's lock held; written once, in C.

    With ``flow`` (flow command, pause byte, reset command: a new
    session's WELCOME) a FLOW sets ``paused`` (the native sender's flag
    once ``flow_to()`` names it) and counts ``flow_pauses``; with
    ``view_of`` (a Publisher) a WANT is applied to its view and
    acknowledged (``want_command``, ``ack_command``), and with
    ``lease_pong`` (pong command, lease token) so is the lease a PONG to a
    lease ping grants; with ``ping`` (ping command, pong command, interval
    in seconds) ``ping_if_due()`` pings the broker on ``next_ping``, and a
    PONG naming the broker ``instance`` says is taken.  On a Stream, the
    broker's TOOK (``took_command``) frees what it took of the kept
    messages."""

    cdef fb_react _x
    cdef object _sock
    cdef tuple _keep                   # the bytes the struct points into
    cdef Publisher _view_of
    cdef Sender _flow_to
    cdef int _paused                   # the FLOW flag while no sender has it
    cdef bytes _instance

    def __cinit__(self, sock, tuple flow=None, Publisher view_of=None, bytes want_command=FB_CMD_WANT_S[:1],
                  bytes ack_command=FB_CMD_ACK_S[:1], tuple lease_pong=None, bytes lease_ask=None, tuple ping=None,
                  bytes took_command=FB_CMD_TOOK_S[:1]):
        require()
        cdef void *h
        self._x.send = _calls_of(sock, &h).send
        self._x.sock = h
        self._sock = sock
        keep = [want_command, ack_command, took_command]
        if flow is not None:
            flow_command, flow_pause, reset_command = flow
            if not (isinstance(flow_command, bytes) and isinstance(flow_pause, bytes) and len(flow_pause) == 1
                    and isinstance(reset_command, bytes)):
                raise TypeError("flow must be (command, one byte, reset command), all bytes")
            keep += [flow_command, reset_command]
            self._x.flow_command = PyBytes_AS_STRING(flow_command)
            self._x.flow_command_len = PyBytes_GET_SIZE(flow_command)
            self._x.flow_pause = <unsigned char>flow_pause[0]
            self._x.flow_paused = &self._paused
            self._x.flow_reset_command = PyBytes_AS_STRING(reset_command)
            self._x.flow_reset_command_len = PyBytes_GET_SIZE(reset_command)
        if view_of is not None:
            self._view_of = view_of
            self._x.want_command = PyBytes_AS_STRING(want_command)
            self._x.want_command_len = PyBytes_GET_SIZE(want_command)
            self._x.ack_command = PyBytes_AS_STRING(ack_command)
            self._x.ack_command_len = PyBytes_GET_SIZE(ack_command)
            self._x.view = &view_of._view
            if lease_pong is not None:
                pong, token = lease_pong
                if not (isinstance(pong, bytes) and isinstance(token, bytes)):
                    raise TypeError("lease_pong must be two bytes objects")
                if len(token) > FB_REACT_TOKEN_MAX:
                    raise ValueError(f"a lease token of at most {FB_REACT_TOKEN_MAX} bytes")
                keep += [pong, token]
                self._x.pong_command = PyBytes_AS_STRING(pong)
                self._x.pong_command_len = PyBytes_GET_SIZE(pong)
                self._x.lease_token = PyBytes_AS_STRING(token)
                self._x.lease_token_len = PyBytes_GET_SIZE(token)
                if lease_ask is not None:
                    # Lease pings (with ``ping``'s command): lease_ping().
                    keep.append(lease_ask)
                    self._x.lease_ask = PyBytes_AS_STRING(lease_ask)
                    self._x.lease_ask_len = PyBytes_GET_SIZE(lease_ask)
        if ping is not None:
            ping_command, pong_command, interval = ping
            if not (isinstance(ping_command, bytes) and isinstance(pong_command, bytes)):
                raise TypeError("ping must be (bytes, bytes, seconds)")
            if not 0 < interval <= 3600:
                raise ValueError(f"the ping interval must be between 0 and 3600 seconds, not {interval!r}")
            keep += [ping_command, pong_command]
            self._x.ping_command = PyBytes_AS_STRING(ping_command)
            self._x.ping_command_len = PyBytes_GET_SIZE(ping_command)
            self._x.live_pong_command = PyBytes_AS_STRING(pong_command)
            self._x.live_pong_command_len = PyBytes_GET_SIZE(pong_command)
            self._x.ping_interval_ns = <uint64_t>(interval * 1e9)
        if isinstance(sock, Stream):
            self._x.took_command = PyBytes_AS_STRING(took_command)
            self._x.took_command_len = PyBytes_GET_SIZE(took_command)
            self._x.took = _stream_acked
        self._keep = tuple(keep)
        self._instance = b""

    def take(self, list frames not None) -> int:
        """A message (a list of bytes) this thread read off the socket, the
        lock held: -1 if it is the caller's to handle (no reaction's, or
        malformed: the caller's reading says what is wrong), 0 if it was
        applied, or the seq of an ACK due that the socket did not take now
        (applied: the caller sends [ack_command, seq] its own way)."""
        cdef const unsigned char *f[FB_REACT_FRAMES_MAX]
        cdef size_t l[FB_REACT_FRAMES_MAX]
        cdef Py_ssize_t i, n = len(frames)
        cdef uint64_t ack = 0
        if n == 0 or n > FB_REACT_FRAMES_MAX:
            return -1
        for i in range(n):
            frame = frames[i]
            if type(frame) is not bytes:
                return -1
            f[i] = <const unsigned char *>PyBytes_AS_STRING(frame)
            l[i] = <size_t>PyBytes_GET_SIZE(frame)
        cdef int fate = fb_react_message(&self._x, <size_t>n, f, l, &ack)
        if fate == FB_REACT_OWNER:
            return -1
        return ack if fate == FB_REACT_ACK else 0

    def lease_ping(self):
        """Send the lease ping the publisher's view asks for, if it does
        (the lock held): None if sent or none is asked for, else the
        message as a list of frames, which the socket did not take now,
        for the caller to send its own way (the renewal is asked for
        again meanwhile)."""
        cdef unsigned char token[FB_REACT_TOKEN_MAX + 8]
        if fb_react_lease_ping(&self._x, fb_now_ns(), token) >= 0:
            return None
        return [PyBytes_FromStringAndSize(<const char *>self._x.ping_command, self._x.ping_command_len),
                PyBytes_FromStringAndSize(<const char *>token, self._x.lease_token_len + 8),
                PyBytes_FromStringAndSize(<const char *>self._x.lease_ask, self._x.lease_ask_len)]

    @property
    def lease_pings(self) -> int:
        """Lease pings sent (by the native sender or the caller's thread)."""
        return fbe_load_u64(&self._x.lease_pings)

    def ping_if_due(self) -> bool:
        """Send the liveness ping if it is due (the lock held); True if sent."""
        return fb_react_ping_if_due(&self._x, fb_now_ns()) != 0

    def flow_to(self, Sender sender) -> None:
        """The native sender whose flag a FLOW sets from now on (None: this
        object's own again), the lock held; the flag carries over."""
        if self._x.flow_paused is NULL:
            return
        cdef int paused = fbe_load_int(self._x.flow_paused)
        if sender is None:
            self._x.flow_paused = &self._paused
            self._x.flow_wake = NULL
        else:
            self._x.flow_paused = &sender._s.paused
            self._x.flow_wake = &sender._s.wake
        fbe_store_int(self._x.flow_paused, paused)
        self._flow_to = sender

    @property
    def paused(self) -> bool:
        """Has the broker asked publishers to pause (its latest FLOW or
        WELCOME, read by whichever thread)?  False without ``flow``."""
        return self._x.flow_paused is not NULL and fbe_load_int(self._x.flow_paused) != 0

    @paused.setter
    def paused(self, bint value):
        if self._x.flow_paused is not NULL:
            fbe_store_int(self._x.flow_paused, value)

    @property
    def next_ping(self) -> float:
        """When the liveness ping is due (``time.monotonic()``'s clock)."""
        return fbe_load_u64(&self._x.next_ping_ns) / 1e9

    @next_ping.setter
    def next_ping(self, double when):
        """Set with the connection's lock held (the native reader, asleep
        until the old time, then sleeps on)."""
        fbe_store_u64(&self._x.next_ping_ns, <uint64_t>(when * 1e9) if when > 0 else 0)

    @property
    def instance(self) -> bytes:
        return self._instance

    @instance.setter
    def instance(self, bytes value not None):
        """The broker's instance (its WELCOME's): a liveness PONG naming it
        is taken; set with the connection's lock held."""
        self._instance = value
        fb_react_set_instance(&self._x, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))

    @property
    def pings_sent(self) -> int:
        return fbe_load_u64(&self._x.pings_sent)

    @property
    def pongs_taken(self) -> int:
        """Liveness PONGs of the known broker taken (nobody else saw them)."""
        return fbe_load_u64(&self._x.pongs_taken)

    @property
    def flow_pauses(self) -> int:
        """FLOW pauses read while not paused."""
        return fbe_load_u64(&self._x.flow_pauses)

    @property
    def wants_refused(self) -> int:
        """WANTs the publisher's view refused (malformed)."""
        return fbe_load_u64(&self._x.wants_refused)


cdef class Reader:
    """A native thread that reads one subscribing connection (``sock``,
    guarded by ``lock``) while no user thread does, into a queue of at most
    ``max_bytes``; ``pop()`` hands the oldest message over, the lock held.
    A message that is not data (its first frame other than ``data_command``)
    wakes the owner (a byte written to ``owner_fd``); with ``wake_on_data``
    every message does (an event loop reads only when woken).  The
    connection's ``reactions`` are applied to what it reads (what they take
    is not queued) and it sends their liveness ping when due; ``sender``
    (the native Sender) reads through this reader between its batches, so
    a FLOW pause stops it after one.  With ``lost_command``, a cut of a
    Stream is queued as that message.  With ``replies`` (a client's
    inbox), each data message is matched to the waiting requests as it is
    read and not queued; ``replies_taken`` counts its records.  See
    csrc/fb_reader.h."""

    cdef fb_reader _r
    cdef SessionLock _lock
    cdef object _sock
    cdef bytes _command
    cdef Reactions _reactions
    cdef Sender _flow_to
    cdef bytes _lost_command
    cdef Replies _replies

    def __cinit__(self, SessionLock lock not None, sock, int owner_fd, Py_ssize_t max_bytes,
                  bytes data_command=FB_CMD_DATA_S[:1], Reactions reactions=None, Sender sender=None, bint wake_on_data=False,
                  bytes lost_command=None, Replies replies=None):
        require()
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        self._lock = lock
        self._sock = sock
        self._command = data_command
        cdef void *h
        self._r.z = _calls_of(sock, &h)[0]
        self._r.sock = h
        self._r.sock_fd = sock.FD
        self._r.slock = &lock._l
        self._r.max_bytes = max_bytes
        self._r.data_command = PyBytes_AS_STRING(data_command)
        self._r.data_command_len = PyBytes_GET_SIZE(data_command)
        self._r.owner_fd = owner_fd
        self._r.wake_on_data = wake_on_data
        if reactions is not None:
            self._reactions = reactions
            self._r.react = &reactions._x
        if isinstance(sock, Stream) and lost_command is not None:
            # A connection that goes is said at once: [lost_command]
            # queued for the owner (fb_reader.h lost).
            self._lost_command = lost_command
            self._r.lost_command = PyBytes_AS_STRING(lost_command)
            self._r.lost_command_len = PyBytes_GET_SIZE(lost_command)
            self._r.lost = fb_zmtp_take_lost
        if replies is not None:
            self._replies = replies
            self._r.replies = replies._t
        cdef int rc = fb_reader_start(&self._r)
        if rc:
            raise OSError(rc, strerror(rc).decode())
        if replies is not None:
            fb_replies_set_read_elsewhere(replies._t, 1)    # (no waiter reads the socket: we do)
        if sender is not None:
            # The sender reads through us between its batches (fb_sender.h
            # reader), so a pause stops it after one; until stop() detaches it.
            self._flow_to = sender
            fbe_store_ptr(<void **>&sender._s.reader, &self._r)

    def __dealloc__(self):
        self._detach()
        with nogil:
            fb_reader_stop(&self._r)

    cdef void _detach(self) noexcept:
        if self._flow_to is not None:
            fbe_store_ptr(<void **>&self._flow_to._s.reader, NULL)
        if self._replies is not None and self._replies._t is not NULL:
            fb_replies_set_read_elsewhere(self._replies._t, 0)   # (a waiting thread leads from now on)

    def stop(self) -> None:
        """Stop the thread and wait for it; what it still holds is dropped.
        With ``flow_to``, call it holding the connection's lock (that
        sender reads through this reader only holding it) or after
        stopping the sender."""
        self._detach()
        with nogil:
            fb_reader_stop(&self._r)

    def wake(self) -> None:
        fb_reader_wake(&self._r)

    def owner_enter(self) -> None:
        """A user thread starts reading the connection: the thread leaves
        the socket to it (see csrc/fb_reader.h)."""
        fb_reader_owner_enter(&self._r)

    def owner_leave(self) -> None:
        """It stops; if none is back within STEP_IN, the thread reads on."""
        fb_reader_owner_leave(&self._r)

    @property
    def replies_taken(self) -> int:
        """Records of the data messages handed to ``replies``."""
        return fbe_load_u64(&self._r.replies_taken)

    @property
    def parks(self) -> int:
        """Times the thread, woken by input, left it to a user thread."""
        return fbe_load_u64(&self._r.parks)

    def let_go(self) -> None:
        """After the connection's lock was let go: wake the thread if it
        asked (it found the lock taken, or its queue full)."""
        if fbe_load_int(&self._r.want_wake):
            fb_reader_wake(&self._r)

    def pop(self):
        """The oldest message read, as a list of frames (bytes), or None;
        the connection's lock held."""
        cdef fb_reader_item *item = NULL
        cdef const unsigned char *frames[MAX_FRAMES]
        cdef size_t lens[MAX_FRAMES]
        cdef size_t n = fb_reader_pop(&self._r, &item, frames, lens, MAX_FRAMES)
        if item is NULL:
            return None
        cdef size_t i
        try:
            return [PyBytes_FromStringAndSize(<const char *>frames[i], lens[i]) for i in range(min(n, MAX_FRAMES))]
        finally:
            fb_reader_release(item)

    @property
    def queued(self) -> int:
        """Messages waiting in the queue."""
        return self._r.queued

    @property
    def queued_bytes(self) -> int:
        return self._r.queued_bytes

    def take_handed(self) -> bool:
        """Was a message the owner must see queued since the last call?"""
        return fbe_exchange_int(&self._r.handed, 0)

    @property
    def read_messages(self) -> int:
        """Messages this thread read."""
        return fbe_load_u64(&self._r.read_messages)

    @property
    def running(self) -> bool:
        return self._r.running
