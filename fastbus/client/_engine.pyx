# cython: language_level=3, boundscheck=False, wraparound=False
"""The client's native engine: what moves a message while no user thread
is inside fastbus, in threads that never take the interpreter lock.

A Python thread that has work for a connection (the client's keeper, a
reader of a PubSub) must first get the interpreter lock, which a busy user
thread holds for up to the switch interval (5 ms by default): a message
that waits for such a thread has that in its latency.  So far the engine
has:

* ``SessionLock``: the lock of one connection, as Python's
  ``threading.Lock`` (the sessions take it as before), which a native
  thread can also hold without the interpreter lock (csrc/fb_slock.h).
* ``Sender``: a native thread per publishing connection that sends what a
  burst left in the outbox, the moment the burst stops, whatever the
  publishing thread does next (csrc/fb_sender.h).  It takes only that
  common case; anything else it hands back to the keeper.

It calls libzmq directly, through the functions of the libzmq that pyzmq
loaded (``fastbus._libzmq``).  Where they cannot be found, ``available()``
is False and the keeper does the sending, as it always did.
"""

from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.string cimport strerror
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

from fastbus._core cimport Outbox, Publisher
from fastbus.includes.fb_sender cimport fb_sender, fb_sender_start, fb_sender_stop, fb_sender_wake
from fastbus.includes.fb_slock cimport (fb_slock, fb_slock_destroy, fb_slock_held, fb_slock_init,
                                        fb_slock_release, fb_slock_try, fb_slock_wait)

cdef extern from *:
    """
    static inline int fbe_load_int(int *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    static inline void fbe_store_int(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
    static inline int fbe_exchange_int(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
    static inline unsigned long long fbe_load_u64(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
    """
    int fbe_load_int(int *p) nogil
    void fbe_store_int(int *p, int v) nogil
    int fbe_exchange_int(int *p, int v) nogil
    unsigned long long fbe_load_u64(uint64_t *p) nogil

ctypedef int (*f_send)(void *s, const void *buf, size_t len, int flags) noexcept nogil
ctypedef int (*f_getsockopt)(void *s, int option, void *value, size_t *len) noexcept nogil

#: The libzmq functions the engine calls (``bind``'s keys).
FUNCTIONS = ("zmq_send", "zmq_getsockopt")

cdef f_send _send = NULL
cdef f_getsockopt _getsockopt = NULL
cdef object _found = None


def available() -> bool:
    """Can a Sender run here (pyzmq's libzmq found, ``FASTBUS_CLIENT_ENGINE``
    not 0)?"""
    global _found, _send, _getsockopt
    if _found is None:
        import os
        from fastbus._libzmq import functions
        addresses = None if os.environ.get("FASTBUS_CLIENT_ENGINE", "1") == "0" else functions(FUNCTIONS)
        if addresses is not None:
            _send = <f_send><uintptr_t>addresses["zmq_send"]
            _getsockopt = <f_getsockopt><uintptr_t>addresses["zmq_getsockopt"]
        _found = addresses is not None
    return _found


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
    send: see csrc/fb_sender.h.  ``wake()`` is the publisher's wake-up."""

    cdef fb_sender _s
    cdef Publisher _pub
    cdef Outbox _outbox
    cdef SessionLock _lock
    cdef object _sock
    cdef bytes _command

    def __cinit__(self, Publisher publisher not None, SessionLock lock not None, sock, int owner_fd,
                  double linger=0.0, bytes command=b"P"):
        if not available():
            raise RuntimeError("the client's engine needs pyzmq's libzmq, which was not found")
        self._pub = publisher
        self._outbox = publisher.outbox
        self._lock = lock
        self._sock = sock                      # kept open while the thread may use it
        self._command = command
        self._s.z.send = _send
        self._s.z.getsockopt = _getsockopt
        self._s.sock = <void *><uintptr_t>sock.underlying
        self._s.slock = &lock._l
        self._s.outbox = &self._outbox._o
        self._s.outbox_lock = &self._outbox._lock
        self._s.sealed = &publisher._sealed
        self._s.last_send_ns = &publisher._last_send_ns
        self._s.streak = &publisher._streak
        self._s.burst_limit = publisher._burst_limit
        self._s.linger_ns = <uint64_t>(linger * 1e9) if linger > 0 else 0
        self._s.command = PyBytes_AS_STRING(command)
        self._s.command_len = PyBytes_GET_SIZE(command)
        self._s.owner_fd = owner_fd
        self._s.wake_r = self._s.wake_w = -1
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

