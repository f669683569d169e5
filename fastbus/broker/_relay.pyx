# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The broker's data plane in C: the loop's poll, and a received PUB batch
routed and each link's batch sent, without a Python call per message or
per batch and without the interpreter lock.

``wait()`` is the broker's poll: it waits on the ROUTER socket and the
loop's other sockets, and while only known sessions' PUBs arrive it routes
and sends them itself, turn after turn, returning to Python only when
something is Python's.  So no Python thread stands between a PUB and its
DATA: not the broker's own (its turn cost about 30 µs in Python), and not
another thread of the process holding the interpreter.

What the broker does with a batch from a known session is always the same:
receive it, route it (fb_router), send every link its outbox as
``[routing id, DATA, seq, batch]``.  In Python that costs about 30 µs a
turn at a low rate (most of a message's time in the broker); here a few.
A session's PING it answers too: the liveness ping every client sends
each ``ping_interval``, and a lease ping (``[PING, token, LEASE_ASK]``:
each filtering publisher sends about 20 a second), once Python has said
the lease (``answer_leases``), recording the grant (``lease_end``), as
Python would: a hundred publishers no longer cost the broker's thread two
thousand turns of Python a second, nor ten thousand idle clients ten
thousand.

Every message the broker sends goes out here: each link's batches, as its
kind carries them (``[routing id, DATA, seq, batch]`` to a session,
``[PUB, batch]`` on the upstream broker's DEALER socket, ``set_upstream``,
one ``[channel, payload]`` per record on the XPUB socket, ``set_xpub``),
and the control messages Python builds (``send``).  What a full pipe will
not take waits in the link's queue (csrc/fb_linkq.h), retried as the
socket reports room, under the slow-consumer policy (``set_policy``): a
queue past ``max_queue_bytes`` loses its oldest data, reported with GAP,
or its session is disconnected; past ``flow_bytes`` it holds publishers
back.  Python decides only what needs it, told by ``events()``: removing a
disconnected or vanished peer, pausing and resuming publishers (FLOW),
building the WANT reset that a queue's mark stands for.  Every other
message read (HELLO, SUB, an ACK, a PUB from an unknown peer, a batch the
decoder refuses) is handed back to Python as a list of frames; a PUB
routed in part or refused, as a typed event (PubRouted).

Its ROUTER is, by default, a Listener (_listener.pxi, csrc/fb_zmtp_server.h):
the ROUTER's end of ZMTP, which this thread reads and writes itself inside
the poll, so no libzmq I/O thread stands between a client's connection and
the relay either.  It calls it through ``self.R``, a table of libzmq's
signatures; a libzmq ROUTER (CURVE, inproc://) goes through the same
table.  Other sockets (the upstream broker's DEALER, the XPUB) are libzmq's:
it calls libzmq directly, through the functions of the libzmq that pyzmq
loaded (``fastbus.broker._libzmq`` finds them; a socket handle is only
valid in the library instance that made it).  Where they cannot be found,
the broker does not start: there is one data plane.  Only the broker's own
thread uses a Relay, as it does the socket.

(This file is over 700 lines because the data plane is one extension type
whose parts share its slots without a call between them, and Cython does
not split a class's methods across files.  What needs no Relay is in
included files: _zmq_calls.pxi, the libzmq calls (their table's shape in
C, csrc/fb_zmq_api.h); _listener.pxi, the Listener; _journal.pxi, the
journal's group commit; and in C, beside csrc/fb_router.c: the links'
state, found by number or routing id, and the lists over them (the links
it retries, the events for Python: csrc/fb_links.h), a session's PING
answered (csrc/fb_leases.h), a link's queue
(csrc/fb_linkq.h), a resumable session's ring (csrc/fb_ring.h), the
protocol's bytes (csrc/fb_protocol.h).  The class reads in three
sections: sessions and links (their sockets, leases, books, the policy),
queues, and the data plane (the poll, reading, routing, sending).)
"""

from libc.errno cimport EAGAIN, EHOSTUNREACH, EINTR, errno
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t, uintptr_t, UINT32_MAX
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy, memset, strerror, strlen
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE

from fastbus._core cimport Router, _hold_fn
from fastbus.includes.fb_batch cimport fb_batch_decode, fb_batch_header, fb_record
from fastbus.includes.fb_common cimport fb_free, fb_now_ns
from fastbus.includes.fb_journal cimport (fb_journal, fb_journal_append, fb_journal_append2, fb_journal_close,
                                         fb_journal_commit, fb_journal_disk_bytes, fb_journal_drop_before,
                                         fb_journal_get_stats, fb_journal_open, fb_journal_pending, fb_journal_read,
                                         fb_journal_stats, FB_JOURNAL_FSYNC_ALWAYS, FB_JOURNAL_FSYNC_EVERYSEC,
                                         FB_JOURNAL_FSYNC_NO, FB_JOURNAL_MAX_RECORD)
from fastbus.includes.fb_protocol cimport *
from fastbus.includes.fb_leases cimport (fb_leases, fb_leases_grant, fb_leases_pong, fb_leases_set, FB_INSTANCE_MAX,
                                        FB_PONG_GONE, FB_PONG_NOT, FB_PONG_QUEUED)
from fastbus.includes.fb_links cimport (fb_link, fb_links, fb_links_ask_flow, fb_links_block, fb_links_detach,
                                        fb_links_drained, fb_links_enforce, fb_links_event, fb_links_exempt,
                                        fb_links_find, fb_links_free, fb_links_hold_fn, fb_links_init, fb_links_lose,
                                        fb_links_mark_dirty, fb_links_name, fb_links_push, fb_links_replay,
                                        fb_links_reserve, fb_links_reset, fb_links_unblock, fb_links_unname,
                                        FB_EVENT_DETACHED, FB_EVENT_FLOW, FB_EVENT_GONE, FB_EVENT_OVERFLOW,
                                        FB_EVENT_SLOW, FB_EVENT_WANT, FB_KEPT, FB_KICK_SLOW, FB_LINKS_MAX,
                                        FB_LINK_IDENT_MAX)
from fastbus.includes.fb_linkq cimport (fb_linkq, fb_linkq_clear, fb_linkq_collapse, fb_linkq_drop_data, fb_linkq_pop,
                                        fb_linkq_push, fb_linkq_push_front, fb_qentry, fb_qentry_frame, fb_qentry_free,
                                        fb_qentry_new, fb_qentry_own,
                                        fb_zmq_msg, fb_zmq_msg_calls, FB_Q_ENTRY_BYTES, FB_Q_FLOW_MARK, FB_Q_FRAMES,
                                        FB_Q_MARK_FLOW, FB_Q_MARK_WANT, FB_Q_WANT_MARK)
from fastbus.includes.fb_ring cimport fb_ring, fb_ring_clear, fb_ring_entry, fb_ring_forget, fb_ring_keep, fb_ring_trim
from fastbus.includes.fb_backlog cimport fb_backlog, fb_backlog_at
from fastbus.includes.fb_router cimport FB_HELD_KEPT   # (the router itself: Router's dp_ calls)
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

import zmq

from fastbus import protocol as P

include "_zmq_calls.pxi"


cdef class PubRouted:
    """What Relay.receive hands Python for a known session's PUB that the
    data plane could not route whole: ``status`` < 0, the router refused
    the batch (a core status code: the sender is dropped with the
    reason); else the batch went but ``over`` of its records were over
    the size limits (the sender is told).  The router counted either."""

    cdef readonly bytes ident
    cdef readonly int status
    cdef readonly uint64_t over

    def __repr__(self) -> str:
        return f"PubRouted(ident={self.ident!r}, status={self.status}, over={self.over})"


cdef class UpstreamRefused:
    """What Relay.take_upstream hands Python for a DATA from upstream that
    the router refused (``status``: a core status code)."""

    cdef readonly int status

    def __repr__(self) -> str:
        return f"UpstreamRefused(status={self.status})"

cdef enum:
    DONTWAIT = 1                 # ZMQ_DONTWAIT
    SNDMORE = 2                  # ZMQ_SNDMORE
    ZMQ_FD = 14                  # getsockopt: the descriptor that signals a socket's pending commands
    ZMQ_EVENTS = 15              # getsockopt: takes those commands in (a full pipe's "room again")
    MAX_PARTS = 8                # frames read of one message; more is a protocol error (Python's)
    MAX_SEND_FRAMES = 8          # frames of a control message Python sends (send())
    LINKS_PER_CALL = 4096
    COPY_MAX = 8192              # batches up to this size are copied; larger ones handed to libzmq
    # A resumable session is told TOOK each time this many more PUBs, or
    # bytes of them, came (and at its pings): what its client keeps for a
    # resend stays far below the bound that makes it wait (max_buffer_bytes).
    TOOK_EVERY = 1024
    TOOK_BYTES = 65536
    POLLIN = 1                   # ZMQ_POLLIN
    MAX_WAITED = 64              # sockets and descriptors wait() watches besides the ROUTER
    BLOCKED_SOCKETS = 3          # ... and the descriptors of the sockets that links wait on (ROUTER, upstream, XPUB)
    # While links wait, the poll also watches their sockets' ZMQ_FD: libzmq
    # says a full pipe has room again with a command (activate_write) that
    # makes it readable, and ZMQ_EVENTS takes it in.  A wake-up lost to a
    # race (libzmq takes commands in during any call on the socket, the
    # relay's own sends included) costs at most this long: queues are
    # retried at least this often, only while some link waits.
    BACKSTOP_MS = 1
    # What wait() found (bits of _run's result).
    FOUND_MESSAGE = 1            # a message for Python (receive() returns it first)
    FOUND_EVENTS = 2             # events for Python (events())
    FOUND_OTHERS = 4             # another socket or descriptor is readable
    FOUND_ACTIVITY = 8           # a message was routed (wait(once=True) returns)
    FOUND_ERROR = 16             # zmq_poll failed (EINTR: a signal for Python; else wait() raises)

# What the data plane tells Python (events()): (kind, link, value).
# (Their values are csrc/fb_links.h's, where the policy raises some.)
cpdef enum:
    EVENT_WANT = FB_EVENT_WANT           # a WANT reset mark reached the head of the link's queue: fill_want()
    EVENT_FLOW = FB_EVENT_FLOW           # links holding publishers back came or went: pause or resume (link: 0)
    EVENT_SLOW = FB_EVENT_SLOW           # a slow consumer, disconnected (value: 0 too slow, 1 not reading control, 2 stuck)
    EVENT_GONE = FB_EVENT_GONE           # a send found the peer gone (EHOSTUNREACH): remove it
    EVENT_OVERFLOW = FB_EVENT_OVERFLOW   # a link without a session reads not even its control messages
    EVENT_DETACHED = FB_EVENT_DETACHED   # a resumable session's connection is gone: it lingers (data waits for it)

# What send() did with a message.
cpdef enum:
    SENT = 0                     # handed to the socket
    QUEUED = 1                   # queued behind what waits for the link (or for its socket's room)
    COLLAPSED = 2                # a WANT or FLOW the queue's mark stands for
    DROPPED = 3                  # a link the relay cannot send to (gone, unknown)
    GONE = 4                     # the peer is gone (EHOSTUNREACH): remove it
    DISCONNECTED = 5             # a slow consumer, disconnected: remove it (an EVENT_SLOW says why)

#: Why a slow consumer was disconnected (EVENT_SLOW's value), as the KICK says.
SLOW_REASONS = ("slow consumer", "slow consumer (not reading its control messages)",
                "slow consumer (took nothing for --stuck-timeout)")
cdef const char *_KICK_SLOW = b'{"reason":"slow consumer"}'
cdef const char *_KICK_CONTROL = b'{"reason":"slow consumer (not reading its control messages)"}'
cdef const char *_KICK_STUCK = b'{"reason":"slow consumer (took nothing for --stuck-timeout)"}'

include "_listener.pxi"

cdef void _free_batch(void *data, void *hint) noexcept nogil:
    # Called by libzmq (its I/O thread) when it is done with a batch.
    fb_free(data)


cdef object _prop(fb_zmq_api *api, fb_zmq_msg *msg, const char *name):
    """A message property (ZeroMQ metadata of its connection), or None."""
    cdef const char *v = api.msg_gets(msg, name)
    return None if v is NULL else v.decode("utf-8", "replace")


cdef struct _jhook:
    # The router's held hook's argument (_journal.pxi's _j_held): the
    # journal, and what it could not append.
    fb_journal *journal
    uint64_t errors


cdef inline void _put_u64(uint8_t *p, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(8):
        p[i] = <uint8_t>(v >> (8 * i))


cdef class Relay:
    """The data plane of one broker's ROUTER socket (see the module doc).

    ``wait(others, timeout_ms)`` is the broker's poll: it routes and sends
    known sessions' PUBs in C until something is Python's.
    ``receive(budget)`` reads, routes and sends until a message is not a
    known session's PUB, and returns that one; ``flush()`` sends every due
    batch.  ``send(link, frames)`` sends Python's control messages, behind
    what waits for the link.  What a socket will not take waits in the
    link's queue here, under the slow-consumer policy (``set_policy``);
    what Python must act on comes from ``events()``.  Counters of the
    broker's traffic, the relay's and what Python routed itself
    (``count_in``): ``batches_in``, ``messages_in``, ``bytes_in`` (routed
    from a link), ``batches_out``, ``messages_out``, ``bytes_out`` (sent),
    per link in ``link_counters()``; ``dropped`` (records lost for want of
    memory), ``dropped_slow`` (records dropped from slow consumers'
    queues), ``gap_notices``, ``control_collapsed``."""

    cdef Router router
    cdef object pysock            # keeps the socket (and its handle) alive
    cdef void *sock
    cdef fb_zmq_api R                # the calls of that socket: libzmq's (Z), or a Listener's (_NATIVE)
    cdef fb_zmtp_server *_srv     # ... the Listener's server (NULL: a libzmq ROUTER)
    cdef fb_links L               # every link's state, by number and by routing id (csrc/fb_links.h)
    cdef fb_zmq_msg _parts[MAX_PARTS]  # a message read for Python, until taken
    cdef int _nparts
    cdef int _rc                  # of that message, if a PUB: the router's status
    cdef uint64_t _over           # ... and the records it dropped over the limits
    cdef uint64_t _delivered      # the record copies the last routed batch made (its receivers)
    cdef object _slow             # that message as (frames, meta), for receive()
    cdef int _errno               # of a failed zmq_poll
    cdef uint32_t _links[LINKS_PER_CALL]
    cdef uint32_t _uplink         # the upstream broker's link (UINT32_MAX: none)
    cdef void *_upsock            # ... and its DEALER socket
    cdef fb_zmq_api U                # that socket's calls: libzmq's (Z), or a Stream's (_STREAM)
    cdef bint _upnative           # ... a Stream (csrc/fb_zmtp.h: it resends what upstream did not take)
    cdef object _uppysock         # (kept alive)
    cdef int _upidx               # that socket's item in wait()'s poll (0: not watched)
    cdef fb_zmq_msg _upv[MAX_PARTS]  # a message from upstream as read (U's messages)
    cdef fb_zmq_msg _up[MAX_PARTS]   # a message from upstream read for Python, until taken (a copy: libzmq's)
    cdef readonly uint64_t up_records  # records of upstream's DATA routed here (its session's stream)
    cdef int _nup
    cdef int _uprc                # of that message, if a DATA: the router's status
    cdef uint32_t _xplink         # the plain-ZeroMQ XPUB link (UINT32_MAX: none)
    cdef void *_xpsock            # ... and its XPUB socket (XPUB_NODROP: a message per record)
    cdef object _xppysock
    cdef int _fds[BLOCKED_SOCKETS]  # ZMQ_FD of the ROUTER, upstream and XPUB sockets (-1: none)
    cdef size_t _retain           # what a resumable session's ring keeps (bytes)
    cdef fb_journal *_journal     # --journal (_journal.pxi), or NULL
    cdef _jhook _jh               # the router's held hook's (_j_held)
    cdef public uint64_t journal_errors   # commits that failed (a full disk): retried
    cdef uint64_t _jcompact_at    # journal_compact_at's: wait() returns once the journal holds this much (0: never)
    cdef public bint journal_due  # ... and did: Python compacts it (Journal.compact)
    cdef public uint64_t batches_in, messages_in, bytes_in, batches_out, messages_out, bytes_out, dropped
    cdef public uint64_t gap_notices, control_collapsed
    cdef public uint64_t messages_replayed
    # The PINGs answered here (Python never sees them): the instance, the
    # lease, and the counts (pings_answered, leases_granted).
    cdef fb_leases _leases
    #: wait() reads at most this many messages before polling again.
    cdef public int budget

    def __cinit__(self, Router router not None, sock not None):
        if not _bound:
            raise RuntimeError("fastbus.broker._relay: the libzmq functions are not bound")
        self.router = router
        self.pysock = sock
        if isinstance(sock, Listener):
            self._srv = (<Listener>sock)._s
            self.sock = <void *>self._srv
            self.R = _NATIVE
            self._fds[0] = (<Listener>sock).FD
        else:
            self.sock = <void *><uintptr_t>sock.underlying
            self.R = Z
            self._fds[0] = sock.getsockopt(zmq.FD)
        if fb_links_init(&self.L) < 0:
            raise MemoryError()
        # A blocked link's outbox is held by the router (sent only when
        # full): the table tells it as links block and unblock.
        cdef _hold_fn hold
        router.dp_hold_hook(&hold, &self.L.hold_arg)
        self.L.hold = <fb_links_hold_fn>hold
        self.budget = 256
        self._uplink = UINT32_MAX
        self._xplink = UINT32_MAX
        self._fds[1] = -1
        self._fds[2] = -1
        self._retain = 16 << 20

    def __dealloc__(self):
        cdef uint32_t k
        cdef int i
        for i in range(self._nparts):
            self.R.msg_close(&self._parts[i])
        for i in range(self._nup):
            Z.msg_close(&self._up[i])
        if self._journal is not NULL:
            self._journal_unhook()
            fb_journal_commit(self._journal, 0)
            fb_journal_close(self._journal)
            self._journal = NULL
        fb_links_free(&self.L, &ZM)

    # -- sessions ----------------------------------------------------------------

    cdef int _reserve(self, uint32_t link) except -1:
        """Room for link ``link`` (and in the lists over links, so adding
        to them never fails)."""
        if fb_links_reserve(&self.L, link) < 0:
            if link >= FB_LINKS_MAX:
                raise ValueError(f"link id {link} out of range (below {FB_LINKS_MAX})")
            raise MemoryError()
        return 0

    def add_session(self, uint32_t link, bytes ident not None, uint64_t seq=0, bint acks=False,
                    bint resumable=False) -> None:
        """A session on this socket: its batches go as [ident, DATA, seq, batch].
        ``acks``: it said "ack" in HELLO (its lease pings are answered here);
        ``resumable``: it named a session to resume, so what it is sent is
        kept (the ring) and a lost connection detaches it (EVENT_DETACHED)
        instead of removing it, until ``resume`` or ``remove_link``."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(ident)
        if n < 1 or n > FB_LINK_IDENT_MAX:
            raise ValueError(f"a routing id has 1 to {FB_LINK_IDENT_MAX} bytes, not {n}")
        self._reserve(link)
        if self.L.at[link].session:
            fb_links_unname(&self.L, link)
        fb_links_reset(&self.L, link, &ZM)
        cdef fb_link *s = &self.L.at[link]
        memset(s, 0, sizeof(fb_link))
        s.session = 1
        s.acks = acks
        s.resumable = resumable
        self._link_ident(link, ident)
        self.confirm(link, seq)

    cdef int _link_ident(self, uint32_t link, bytes ident) except -1:
        """Make ``ident`` (1..FB_LINK_IDENT_MAX bytes, checked) the routing
        id of session ``link``, not in the index now: a session that held
        it before loses it (its peer is gone: ids are not reused)."""
        if fb_links_name(&self.L, link, <const uint8_t *>PyBytes_AS_STRING(ident), PyBytes_GET_SIZE(ident)) < 0:
            raise MemoryError()
        return 0

    def answer_leases(self, bytes instance not None, double lease_s) -> None:
        """Answer sessions' PINGs here from now on, as broker ``instance``:
        PONG ``[token, instance]``, and to a lease ping ``[token, instance,
        lease µs]``, granting ``lease_s`` seconds (0: leave lease pings to
        Python, as a broker with an upstream does, whose lease depends on
        its own from upstream)."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(instance)
        if n > FB_INSTANCE_MAX:
            raise ValueError(f"an instance id has at most {FB_INSTANCE_MAX} bytes")
        if lease_s < 0 or lease_s > 3600:
            raise ValueError("a lease is 0 to 3600 seconds")
        fb_leases_set(&self._leases, PyBytes_AS_STRING(instance), n, <uint64_t>(lease_s * 1e9))

    @property
    def pings_answered(self) -> int:
        """PINGs answered here (liveness and lease pings)."""
        return self._leases.answered

    @property
    def leases_granted(self) -> int:
        """... of them lease pings, a lease granted."""
        return self._leases.granted

    def grant(self, uint32_t link, uint64_t lease_us) -> None:
        """Python granted the session a lease of ``lease_us`` from now
        (WELCOME, or a PONG it answered): recorded beside the relay's own
        grants, so that the session's lease has one home (``lease_end``).
        The peer keeps the latest end it was granted, so this never
        shortens it."""
        if link < self.L.n and self.L.at[link].session:
            fb_leases_grant(&self.L.at[link], fb_now_ns() + lease_us * 1000u)

    def lease_end(self, uint32_t link) -> float:
        """When the last lease granted to the session ends (by the relay
        or through ``grant``), in time.monotonic() seconds (-inf: none)."""
        if link < self.L.n and self.L.at[link].session and self.L.at[link].lease_end_ns:
            return self.L.at[link].lease_end_ns / 1e9
        return float("-inf")

    def set_upstream(self, uint32_t link, sock not None) -> None:
        """The upstream broker's link and its DEALER socket: a pyzmq socket
        of this broker's context, or a fastbus Stream (csrc/fb_zmtp.h,
        read and written by this thread).  The relay sends it its
        batches as ``[PUB, batch]``, as it does sessions theirs, while the
        router does not hold it (Python queues for it) and its sends
        succeed.  While wait() watches that socket (among ``others``), it
        also reads it: ``[DATA, seq, batch]`` is routed here (its records
        counted in ``up_records``), and the first other message is kept
        for Python, which takes it with ``take_upstream()`` before reading
        the socket itself."""
        self._upnative = not isinstance(sock, zmq.Socket)
        self.U = _STREAM if self._upnative else Z
        self._upsock = self._own_socket(link, sock, 1)
        self._uplink = link
        self._uppysock = sock
        self.up_records = 0

    def set_xpub(self, uint32_t link, sock not None) -> None:
        """The plain-ZeroMQ XPUB link and its socket (XPUB_NODROP): the
        relay sends it one ``[channel, payload]`` message per record (XPUB
        filters per subscriber), queueing the rest of a batch its socket
        refuses."""
        self._xpsock = self._own_socket(link, sock, 2)
        self._xplink = link
        self._xppysock = sock

    cdef void *_own_socket(self, uint32_t link, sock, int k) except NULL:
        """A link on a socket of its own (k: its place among the watched
        descriptors): its slot, and the socket's libzmq handle."""
        self._reserve(link)                      # (ValueError past FB_LINKS_MAX)
        self._fds[k] = sock.getsockopt(zmq.FD) if isinstance(sock, zmq.Socket) else sock.FD
        return <void *><uintptr_t>sock.underlying

    def set_policy(self, size_t max_queue_bytes, size_t flow_bytes, bint disconnect) -> None:
        """The slow-consumer policy (fastbus/broker/sending.py): a link's
        queue holds at most ``max_queue_bytes`` (past it: drop its oldest
        data batches, reported with GAP, or with ``disconnect`` end a
        session); past ``flow_bytes`` (0: never) it holds publishers back
        (EVENT_FLOW) until it is down to a quarter of that."""
        if max_queue_bytes < 1:
            raise ValueError("max_queue_bytes must be positive")
        self.L.max_queue = max_queue_bytes
        self.L.flow_bytes = flow_bytes
        self.L.disconnect = disconnect
        # What a resumable session keeps of what it was sent: enough for
        # what a cut connection's buffers held, and a quarter of the queue
        # bound, so that a lingering session (its ring and what waits for
        # it) stays within 1.25 times it.
        self._retain = max_queue_bytes // 4

    # -- resumable sessions: detached, resumed (docs/PROTOCOL.md) ---------------

    def resume(self, uint32_t link, bytes ident not None, uint64_t taken, list first not None) -> tuple:
        """The client of resumable session ``link`` is back on connection
        ``ident``, having taken ``taken`` of its stream: ``first`` (a
        control message: WELCOME) goes first, then a GAP of whatever the
        ring no longer holds (exact), then what the ring holds past
        ``taken``, again, then what waited while it was away, then the live
        stream.  Returns ``(records replayed, records announced lost)``."""
        cdef fb_link *s
        cdef fb_qentry *e
        cdef uint64_t lost = 0, replayed = 0
        cdef Py_ssize_t n = PyBytes_GET_SIZE(ident)
        cdef int i, nf = len(first)
        cdef bytes f
        if link >= self.L.n or not self.L.at[link].session or not self.L.at[link].resumable or \
                self.L.at[link].gone:
            raise ValueError(f"link {link} is not a resumable session")
        if n < 1 or n > FB_LINK_IDENT_MAX or nf < 1 or nf > MAX_SEND_FRAMES:
            raise ValueError("a routing id of 1 to 255 bytes and a control message of 1 to 8 frames")
        s = &self.L.at[link]
        if taken > s.taken:
            raise ValueError(f"taken {taken} is past what the session was sent ({s.taken})")
        fb_links_unname(&self.L, link)
        self._link_ident(link, ident)
        # The ring's entries past ``taken`` ahead of what waits, what it
        # no longer holds told by a GAP (csrc/fb_links.h).
        replayed = fb_links_replay(&self.L, link, taken, &ZM, &lost)
        # ``first`` ahead of everything.
        e = fb_qentry_new(&ZM, nf)
        if e is NULL:
            raise MemoryError()
        for i in range(nf):
            f = first[i] if type(first[i]) is bytes else bytes(first[i])
            if fb_qentry_frame(&ZM, e, i, PyBytes_AS_STRING(f), PyBytes_GET_SIZE(f)) < 0:
                fb_qentry_free(&ZM, e)
                raise MemoryError()
        fb_linkq_push_front(&s.q, e)
        fb_links_unblock(&self.L, link)
        s.detached = 0
        self.messages_replayed += replayed
        fb_links_block(&self.L, link)
        with nogil:
            self._drain_link(link, fb_now_ns())
        return replayed, lost

    def pending(self, uint32_t link, uint64_t took) -> list:
        """What session ``link`` is owed past ``took`` of its stream (what
        its client said it took): the batches sent and kept for a resume,
        then those waiting, as ``(batch bytes, records of it to skip)``; a
        queue group hands them to another member when the session runs out
        (fastbus.broker.loop).  GAPs and control messages are not in it."""
        cdef fb_link *s
        cdef fb_ring_entry *r
        cdef fb_qentry *e
        cdef uint64_t start
        out = []
        if link >= self.L.n:
            return out
        s = &self.L.at[link]
        r = s.ring.head
        while r is not NULL:
            start = r.end - r.records
            if r.buf is not NULL and r.end > took:
                out.append((PyBytes_FromStringAndSize(<char *>r.buf, r.len), took - start if took > start else 0))
            r = r.next
        e = s.q.head
        while e is not NULL:
            if e.kind == FB_Q_FRAMES and e.records and e.nframes == 3 and not e.done:
                out.append((PyBytes_FromStringAndSize(<char *>Z.msg_data(&e.frames[2]),
                                                      Z.msg_size(&e.frames[2])), 0))
            e = e.next
        return out

    def detach(self, uint32_t link) -> None:
        """A resumable session's client left saying it keeps the session (a
        durable subscriber's BYE): it lingers as if its connection were
        lost (EVENT_DETACHED follows)."""
        if link < self.L.n and self.L.at[link].session and self.L.at[link].resumable and \
                not self.L.at[link].gone:
            fb_links_detach(&self.L, link)

    def trim(self, uint32_t link, uint64_t taken) -> None:
        """The client of a resumable session says it took its stream up to
        ``taken`` (TAKEN): what that covers is no longer kept."""
        if link < self.L.n and self.L.at[link].resumable:
            fb_ring_trim(&self.L.at[link].ring, taken)

    # -- the journal (_journal.pxi) ---------------------------------------

    def journal_open(self, str path not None, str fsync not None, uint64_t segment_bytes=0) -> None:
        """Journal from now on into the directory ``path`` (a new segment;
        read what is there first: read_journal).  ``fsync``: "always",
        "everysec" or "no".  OSError if it cannot be written."""
        cdef int mode = {"no": FB_JOURNAL_FSYNC_NO, "everysec": FB_JOURNAL_FSYNC_EVERYSEC,
                         "always": FB_JOURNAL_FSYNC_ALWAYS}[fsync]
        if self._journal is not NULL:
            raise ValueError("the journal is open")
        self._journal = fb_journal_open(path.encode(), mode, segment_bytes, 0)
        if self._journal is NULL:
            err = errno
            raise OSError(err, f"cannot write a journal in {path}: {strerror(err).decode()}")
        self._jh.journal = self._journal
        self.router.dp_set_held_hook(_j_held, &self._jh)     # (held groups' backlogs: _j_held)

    cdef void _journal_unhook(self) noexcept:
        self.router.dp_set_held_hook(NULL, NULL)
        self._jh.journal = NULL

    def journal_session(self, uint32_t link, bytes sid not None) -> None:
        """Resumable session ``link`` is journaled under ``sid`` (16 bytes):
        what is routed to it from now on is appended, and goes out only once
        committed."""
        if link >= self.L.n or not self.L.at[link].session or PyBytes_GET_SIZE(sid) != 16:
            raise ValueError("a session and a 16-byte id")
        memcpy(self.L.at[link].jsid, PyBytes_AS_STRING(sid), 16)
        self.L.at[link].jhas = self._journal is not NULL

    def journal_append(self, int kind, bytes payload not None) -> None:
        """A record of Python's (what describes a session), in order with
        the relay's; written by the next commit."""
        if self._journal is NULL:
            return
        if fb_journal_append(self._journal, <uint8_t>kind, PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload)) < 0:
            self.journal_errors += 1

    def journal_commit(self, bint roll=False) -> bool:
        """Commit now (``roll``: and start a new segment); False if the
        write failed (counted in journal_errors; tried again)."""
        if self._journal is NULL:
            return True
        if _j_commit(self) < 0:
            return False
        return not roll or fb_journal_commit(self._journal, 1) == 0

    def journal_snapshot(self, size_t budget) -> int:
        """Append everything the journaled sessions are owed (at most
        ``budget`` bytes of batches; see _j_snapshot); the bytes appended."""
        if self._journal is NULL:
            return 0
        _j_commit(self)
        return _j_snapshot(self, budget)

    def journal_compact_at(self, uint64_t nbytes) -> None:
        """wait() returns once the journal's segments hold ``nbytes`` (0:
        never), with ``journal_due`` set: checked after every turn's commit,
        so a compaction is never a maintenance interval of writes late (the
        directory's bound).  It fires once: Journal.compact arms it again."""
        self._jcompact_at = nbytes
        self.journal_due = False

    def journal_backlog(self, uint64_t group_id, bytes mark not None) -> int:
        """Append held group ``group_id``'s backlog as it is now, under its
        ``mark`` (a snapshot: Journal.compact); how many records."""
        if self._journal is NULL or not 0 < PyBytes_GET_SIZE(mark) <= 32:
            return 0
        return _j_backlog(self, group_id, <const unsigned char *>PyBytes_AS_STRING(mark), PyBytes_GET_SIZE(mark))

    def journal_drop_before(self, uint64_t segment) -> int:
        """Delete the segments before ``segment``; how many."""
        return fb_journal_drop_before(self._journal, segment) if self._journal is not NULL else 0

    def journal_restore(self, uint32_t link, list batches not None, uint64_t stream_end, uint64_t taken,
                        uint64_t received) -> int:
        """A session read back from the journal (added, detached): its ring
        holds ``batches`` [(end, records, seq, batch bytes)] past ``taken``
        (what its client took, as it last said), its stream counts on from
        ``stream_end``, and ``received`` of what it sent had come.  The
        records kept."""
        cdef fb_link *s
        cdef unsigned char *buf
        cdef bytes b, seq
        cdef uint64_t kept = 0, end
        cdef size_t n
        if link >= self.L.n or not self.L.at[link].session or not self.L.at[link].resumable:
            raise ValueError(f"link {link} is not a resumable session")
        s = &self.L.at[link]
        fb_ring_forget(&s.ring, taken)
        batches = sorted(x for x in batches if x[0] > taken and x[1] > 0 and len(x[2]) == 8)
        if batches and batches[0][0] - batches[0][1] > taken:
            # The journal did not keep what came before (its bound): a
            # resume from before it is told the loss (GAP), exactly.
            s.ring.trimmed = batches[0][0] - batches[0][1]
        for end, records, seq, b in batches:
            n = PyBytes_GET_SIZE(b)
            buf = <unsigned char *>malloc(n if n else 1)
            if buf is NULL:
                fb_ring_forget(&s.ring, end)
                continue
            memcpy(buf, PyBytes_AS_STRING(b), n)
            # (Within the queue's bound, not the ring's: a lingering
            # session's queue was journaled too.)
            fb_ring_keep(&s.ring, buf, n, records, end, <const uint8_t *>PyBytes_AS_STRING(seq), self.L.max_queue)
            kept += records
        s.taken = s.jend = max(stream_end, taken)
        s.received = s.received_told = s.received_committed = received
        return kept

    def journal_stats(self) -> dict | None:
        """The journal's figures (None without one): bytes and segments on
        disk, commits, syncs and their time, errors."""
        cdef fb_journal_stats st
        cdef uint64_t segments = 0
        if self._journal is NULL:
            return None
        fb_journal_get_stats(self._journal, &st)
        return {"bytes": fb_journal_disk_bytes(self._journal, &segments), "segments": segments,
                "segment": st.segment, "commits": st.commits, "bytes_written": st.bytes_written,
                "fsyncs": st.fsyncs, "fsync_seconds": st.fsync_ns / 1e9, "fsync_max_seconds": st.fsync_max_ns / 1e9,
                "write_errors": self.journal_errors + self._jh.errors, "dropped_bytes": st.dropped_bytes}

    def journal_close(self) -> None:
        """Commit what is appended and close the journal."""
        if self._journal is not NULL:
            _j_commit(self)
            self._journal_unhook()
            fb_journal_close(self._journal)
            self._journal = NULL

    def ring_from(self, uint32_t link) -> int:
        """Where what the ring keeps for session ``link`` starts: the stream
        count through the last entry it let go (a resume from there or
        later misses nothing)."""
        return self.L.at[link].ring.trimmed if link < self.L.n else 0

    def resume_state(self, uint32_t link) -> tuple:
        """``(detached, stream count, bytes kept for a resume, records
        waiting in its queue or lost there and not yet announced)``."""
        cdef fb_link *s
        cdef fb_qentry *e
        cdef uint64_t waiting = 0
        if link >= self.L.n:
            return (False, 0, 0, 0)
        s = &self.L.at[link]
        e = s.q.head
        while e is not NULL:
            waiting += e.records - e.done
            e = e.next
        return (bool(s.detached), s.taken, s.ring.bytes, waiting + s.q.lost)

    cdef void _tell_took(self, uint32_t link, bint queue) noexcept nogil:
        """TOOK [a, received]: the client may forget what it kept of this
        session's PUBs and SUBs up to it.  At once, or (``queue``) behind
        what waits for the session; not at all while it is detached or a
        queue waits (the next one says it)."""
        cdef fb_link *s = &self.L.at[link]
        cdef uint8_t buf[8]
        cdef fb_qentry *e
        cdef uint64_t took = s.received_committed if self._journal is not NULL else s.received
        if s.detached or s.gone:
            return
        _put_u64(buf, took)
        if s.q.head is NULL and not s.q.lost:
            if self._send_small(link, FB_CMD_TOOK_S, buf, 8) == 0:
                s.received_told = took
                s.received_bytes = 0
            return
        if not queue:
            return
        e = fb_qentry_new(&ZM, 2)
        if e is NULL or fb_qentry_frame(&ZM, e, 0, FB_CMD_TOOK_S, 1) < 0 or fb_qentry_frame(&ZM, e, 1, buf, 8) < 0:
            if e is not NULL:
                fb_qentry_free(&ZM, e)
            return
        e.cmd = FB_CMD_TOOK
        fb_linkq_push(&s.q, e)
        s.received_told = took
        s.received_bytes = 0
        self._queued(link, QUEUED)

    def count_received(self, uint32_t link) -> None:
        """Python took a counted message (a SUB) from a session."""
        if link < self.L.n:
            self.L.at[link].received += 1
            if self._journal is not NULL:
                _j_mark(self, link)

    def received(self, uint32_t link) -> int:
        """The counted messages (PUB, SUB) the session sent that came."""
        return self.L.at[link].received if link < self.L.n else 0

    def tell_took(self, uint32_t link) -> None:
        """TOOK to a resumable session, before a PONG Python answers (with
        a journal, what it covers committed first)."""
        if self._journal is not NULL:
            _j_commit(self)
        if link < self.L.n and self.L.at[link].resumable and \
                self.L.at[link].received != self.L.at[link].received_told:
            self._tell_took(link, True)

    cdef void _retain_sent(self, fb_link *s, unsigned char *buf, size_t len, uint64_t records,
                           const uint8_t *seq) noexcept nogil:
        """A batch (``buf``, now the ring's; NULL: a GAP of ``records``)
        went to a resumable session with DATA seq ``seq``: counted in its
        stream and kept."""
        s.taken += records
        fb_ring_keep(&s.ring, buf, len, records, s.taken, seq, self._retain)

    def remove_link(self, uint32_t link) -> None:
        """The link left: its slot (session, lease, traffic, queue) is
        cleared for the next link given its id."""
        cdef int i
        if link == self._uplink:
            for i in range(self._nup):
                Z.msg_close(&self._up[i])
            self._nup = 0
            self._uplink = UINT32_MAX
            self._upsock = NULL
            self._uppysock = None
            self._fds[1] = -1
        if link == self._xplink:
            self._xplink = UINT32_MAX
            self._xpsock = NULL
            self._xppysock = None
            self._fds[2] = -1
        if link < self.L.n:
            fb_links_reset(&self.L, link, &ZM)
            if self.L.at[link].session:
                fb_links_unname(&self.L, link)
            memset(&self.L.at[link], 0, sizeof(fb_link))

    def discard_queue(self, uint32_t link) -> None:
        """Forget what waits for a link, its unreported loss included (a
        session that starts over)."""
        if link < self.L.n:
            fb_links_reset(&self.L, link, &ZM)

    def count_in(self, uint32_t link, uint64_t records, uint64_t nbytes) -> None:
        """Python routed a batch from the link (a batch from upstream it
        read itself, a plain PUB socket's message): counted with the
        relay's."""
        self._reserve(link)                      # (ValueError past FB_LINKS_MAX)
        self._count_routed(&self.L.at[link], records, nbytes)

    def confirm(self, uint32_t link, uint64_t seq) -> None:
        """The seq that the link's DATA frames carry from now on (the SUB
        with this seq is applied; the relay is the one place that holds
        it: data_seq)."""
        cdef int i
        if link < self.L.n:
            for i in range(8):
                self.L.at[link].seq[i] = <uint8_t>(seq >> (8 * i))

    def data_seq(self, uint32_t link) -> int:
        """The seq the link's DATA frames carry (confirm's; 0 for a link
        the relay does not know)."""
        cdef int i
        cdef uint64_t seq = 0
        if link < self.L.n:
            for i in range(8):
                seq |= (<uint64_t>self.L.at[link].seq[i]) << (8 * i)
        return seq

    # -- queues: what a link's socket would not take yet -----------------------

    def send(self, uint32_t link, list frames not None) -> int:
        """Send Python's control message (``frames``: bytes, at most
        MAX_SEND_FRAMES) to a link: at once if nothing waits for it and
        its socket takes it, else behind what waits, in its queue (a WANT
        to a session or a FLOW collapses into the queue's mark for its
        kind).  Returns SENT, QUEUED, COLLAPSED, DROPPED (a link the relay
        cannot send to: gone, unknown, the XPUB link), GONE (the peer
        vanished: remove it) or DISCONNECTED (queueing it made the link a
        slow consumer: remove it; an EVENT_SLOW says why)."""
        cdef int n = len(frames), i, rc
        cdef fb_link *s
        cdef fb_qentry *e
        cdef uint8_t cmd
        cdef bytes f
        if n < 1 or n > MAX_SEND_FRAMES:
            raise ValueError(f"a control message has 1 to {MAX_SEND_FRAMES} frames, not {n}")
        frames = [x if type(x) is bytes else bytes(x) for x in frames]
        self._written_before_said()
        if link >= self.L.n or link == self._xplink or self.L.at[link].gone or \
                not (self.L.at[link].session or link == self._uplink):
            return DROPPED
        s = &self.L.at[link]
        f = frames[0]
        cmd = <uint8_t>f[0] if len(f) else 0
        if s.q.head is NULL and not s.q.lost and not s.detached:
            rc = self._send_frames(link, frames)
            if rc == 0:
                s.last_sent_ns = fb_now_ns()
                return SENT
            if rc != EAGAIN:
                fb_links_lose(&self.L, link, EVENT_GONE, 0, &ZM)
                if s.gone:
                    return GONE                  # (a resumable session lingers: queued below)
        if len(f) == 1 and ((cmd == FB_CMD_WANT and s.session) or cmd == FB_CMD_FLOW):
            if fb_linkq_collapse(&ZM, &s.q, cmd, FB_Q_MARK_WANT if cmd == FB_CMD_WANT else FB_Q_MARK_FLOW,
                           FB_Q_WANT_MARK if cmd == FB_CMD_WANT else FB_Q_FLOW_MARK):
                self.control_collapsed += 1
                return self._queued(link, COLLAPSED)
        e = fb_qentry_new(&ZM, n)
        if e is NULL:
            raise MemoryError()
        e.cmd = cmd
        for i in range(n):
            f = frames[i]
            if fb_qentry_frame(&ZM, e, i, PyBytes_AS_STRING(f), PyBytes_GET_SIZE(f)) < 0:
                fb_qentry_free(&ZM, e)
                raise MemoryError()
        fb_linkq_push(&s.q, e)
        return self._queued(link, QUEUED)

    def reply(self, bytes ident not None, list frames not None) -> bool:
        """Send ``[ident, *frames]`` (bytes) on the ROUTER socket to a peer
        that has no session here (an answer to an unknown peer, a refused
        HELLO, BYE once it is forgotten), or a one-off answer that need not
        wait behind a session's queue (STATS): at once or not at all
        (a full pipe, a peer gone).  True if it went."""
        cdef int i, n = len(frames)
        cdef bytes f
        if n < 1 or n > MAX_SEND_FRAMES or not 1 <= len(ident) <= FB_LINK_IDENT_MAX:
            raise ValueError(f"a reply has 1 to {MAX_SEND_FRAMES} frames and a routing id of 1 to {FB_LINK_IDENT_MAX} bytes")
        frames = [x if type(x) is bytes else bytes(x) for x in frames]
        self._written_before_said()
        if self.R.send(self.sock, PyBytes_AS_STRING(ident), PyBytes_GET_SIZE(ident), DONTWAIT | SNDMORE) < 0:
            return False
        for i in range(n):
            f = frames[i]
            self.R.send(self.sock, PyBytes_AS_STRING(f), PyBytes_GET_SIZE(f), DONTWAIT | (SNDMORE if i < n - 1 else 0))
        return True

    cdef int _send_frames(self, uint32_t link, list frames) except -1:
        """Send bytes frames to a session or the upstream link: 0, or the
        errno of the first frame (EAGAIN: the socket's pipe is full; the
        rest cannot fail once the first went)."""
        cdef void *sock = self._upsock if link == self._uplink else self.sock
        cdef fb_zmq_api *api = self._api(link)
        cdef int i, n = len(frames), err
        cdef bytes f
        if link != self._uplink:
            if api.send(sock, self.L.at[link].ident, self.L.at[link].idlen, DONTWAIT | SNDMORE) < 0:
                err = api.last_error()
                return err if err != 0 else EAGAIN
        for i in range(n):
            f = frames[i]
            if api.send(sock, PyBytes_AS_STRING(f), PyBytes_GET_SIZE(f),
                        DONTWAIT | (SNDMORE if i < n - 1 else 0)) < 0 and i == 0 and link == self._uplink:
                err = api.last_error()
                return err if err != 0 else EAGAIN
        return 0

    cdef inline void _written_before_said(self) noexcept nogil:
        # What Python appended to the journal this turn (a subscription,
        # a held group declared or released) is written before anything
        # Python says next (its CONFIRM, a STATS answer): a kill -9 after
        # the word cannot undo what it said was done.  The turn's own
        # commit would come only after Python's turn, which may answer
        # several peers first.
        if self._journal is not NULL and fb_journal_pending(self._journal):
            _j_commit(self)

    cdef inline fb_zmq_api *_api(self, uint32_t link) noexcept nogil:
        """The calls of a link's socket: the upstream DEALER's self.U, the
        XPUB's libzmq's, the sessions' ROUTER's self.R."""
        if link == self._uplink:
            return &self.U
        return &Z if link == self._xplink else &self.R

    cdef inline bint _up_buffered(self) noexcept nogil:
        """Whole messages the upstream Stream already read (its descriptor
        does not show them)."""
        return self._upnative and self._upsock is not NULL and self._upidx and \
            fb_zmtp_buffered(<fb_zmtp *>self._upsock)

    cdef int _queued(self, uint32_t link, int status) noexcept nogil:
        """A link's queue just grew: it is blocked, and over the limit the
        policy applies.  ``status``, or DISCONNECTED."""
        fb_links_block(&self.L, link)
        if self._enforce(link):
            return DISCONNECTED
        return status

    cdef void _enqueue(self, uint32_t link, fb_qentry *e) noexcept nogil:
        """Queue a data entry (the policy applies)."""
        fb_links_push(&self.L, link, e)
        self._queued(link, QUEUED)

    cdef bint _enforce(self, uint32_t link) noexcept nogil:
        """The slow-consumer policy on a queue that just grew
        (csrc/fb_links.h: fb_links_enforce): a session it says to
        disconnect is kicked.  True if it was."""
        cdef int verdict = fb_links_enforce(&self.L, link, &ZM)
        if verdict == FB_KEPT:
            return False
        self._kick(link, 0 if verdict == FB_KICK_SLOW else 1)
        return True

    cdef void _kick(self, uint32_t link, uint32_t why) noexcept nogil:
        """Disconnect a slow consumer: its queue goes, the peer is told
        (KICK, if its socket takes it) and Python removes it."""
        cdef fb_link *s = &self.L.at[link]
        cdef const char *reason = _KICK_SLOW if why == 0 else _KICK_CONTROL if why == 1 else _KICK_STUCK
        fb_links_lose(&self.L, link, EVENT_SLOW, why, &ZM)
        if self.R.send(self.sock, s.ident, s.idlen, DONTWAIT | SNDMORE) >= 0:
            self.R.send(self.sock, FB_CMD_KICK_S, 1, DONTWAIT | SNDMORE)
            self.R.send(self.sock, reason, strlen(reason), DONTWAIT)

    cdef void _event(self, uint32_t kind, uint32_t link, uint32_t value) noexcept nogil:
        # The events' room (csrc/fb_links.h): at most one of each kind a link
        # is pending (gone or slow once, overflow once, a WANT mark asked or
        # a detach once) and one flow.
        fb_links_event(&self.L, kind, link, value)

    cdef void _drain(self, uint64_t now) noexcept nogil:
        """Retry every blocked link's queue (see _drain_link); once none
        holds publishers back, Python hears it may resume them."""
        cdef uint32_t i = 0, n
        cdef int k
        # Take in the sockets' commands first: "a full pipe has room again"
        # arrives as one (libzmq's activate_write), and until it is taken
        # in the socket still refuses.
        cdef int events
        cdef size_t sz
        cdef void *socks[BLOCKED_SOCKETS]
        socks[0] = self.sock
        socks[1] = self._upsock
        socks[2] = self._xpsock
        for k in range(BLOCKED_SOCKETS):
            if socks[k] is not NULL:
                sz = sizeof(int)
                if k == 0:
                    self.R.getsockopt(socks[k], ZMQ_EVENTS, &events, &sz)
                elif k == 1:
                    self.U.getsockopt(socks[k], ZMQ_EVENTS, &events, &sz)
                else:
                    Z.getsockopt(socks[k], ZMQ_EVENTS, &events, &sz)
        while i < self.L.nblocked:
            n = self.L.nblocked
            self._drain_link(self.L.blocked[i], now)
            if self.L.nblocked == n:
                i += 1                           # still blocked (else the last took its place)
        if self.L.paused and not self.L.nholding:
            fb_links_ask_flow(&self.L)

    cdef void _drain_link(self, uint32_t link, uint64_t now) noexcept nogil:
        """Send what waits for a link, in order, each loss reported (GAP)
        before the data that follows it, until its socket refuses; a WANT
        mark at the head waits for Python to build it (EVENT_WANT)."""
        cdef fb_link *s = &self.L.at[link]
        cdef fb_qentry *e
        cdef int rc
        cdef uint8_t buf[8]
        cdef size_t nb
        cdef uint64_t records
        cdef unsigned char *kept
        while not s.gone and not s.detached:
            if s.q.lost and (s.q.head is NULL or s.q.head.records):
                if link == self._xplink:
                    rc = 0                       # plain SUB sockets have no GAP: the loss is only counted
                else:
                    _put_u64(buf, s.q.lost)
                    rc = self._send_small(link, FB_CMD_GAP_S, buf, 8)
                if rc == EAGAIN:
                    break
                if rc:
                    fb_links_lose(&self.L, link, EVENT_GONE, 0, &ZM)
                    if s.gone:
                        return
                    continue                     # detached: the GAP stays to tell
                if link != self._xplink:
                    self.gap_notices += 1
                if s.resumable:
                    self._retain_sent(s, NULL, 0, s.q.lost, s.seq)
                s.q.lost = 0
            e = s.q.head
            if e is NULL:
                break
            if e.kind == FB_Q_WANT_MARK:
                if not s.asked:
                    s.asked = 1
                    self._event(EVENT_WANT, link, 0)
                break
            if e.kind == FB_Q_FLOW_MARK:
                rc = self._send_small(link, FB_CMD_FLOW_S, FB_FLOW_PAUSE_S if self.L.paused else FB_FLOW_RESUME_S, 1)
                if rc == 0:
                    s.q.marks &= ~FB_Q_MARK_FLOW
            else:
                records = e.records
                nb = Z.msg_size(&e.frames[e.nframes - 1])
                kept = NULL
                if records and s.resumable and e.nframes == 3:
                    # Kept for a resume: a copy, as the socket takes the frames.
                    kept = <unsigned char *>malloc(nb if nb else 1)
                    if kept is not NULL:
                        memcpy(kept, Z.msg_data(&e.frames[2]), nb)
                        memcpy(buf, Z.msg_data(&e.frames[1]), 8)
                rc = self._send_entry(link, e)
                if rc == 0 and records:
                    self._count_sent(s, records, nb)
                    if s.resumable:
                        if kept is NULL:
                            # No memory for the copy: a resume from before
                            # it is told the loss (the ring forgets it).
                            s.taken += records
                            fb_ring_forget(&s.ring, s.taken)
                        else:
                            self._retain_sent(s, kept, nb, records, buf)
                            kept = NULL
                if kept is not NULL:
                    free(kept)
            if rc == EAGAIN:
                break
            if rc:
                fb_links_lose(&self.L, link, EVENT_GONE, 0, &ZM)
                if s.gone:
                    return
                continue                         # detached: the entry waits for the resume
            fb_linkq_pop(&ZM, &s.q)
            s.last_sent_ns = now
        if s.gone or s.detached:
            return
        fb_links_drained(&self.L, link)
        if s.q.head is NULL and not s.q.lost:
            fb_links_unblock(&self.L, link)

    cdef int _send_small(self, uint32_t link, const char *cmd, const void *arg, size_t n) noexcept nogil:
        """[cmd, arg] to a session or the upstream link: 0 or the errno."""
        cdef void *sock = self.sock
        cdef fb_zmq_api *api = self._api(link)
        cdef int err
        if link == self._uplink:
            sock = self._upsock
        elif api.send(sock, self.L.at[link].ident, self.L.at[link].idlen, DONTWAIT | SNDMORE) < 0:
            err = api.last_error()
            return err if err != 0 else EAGAIN
        if api.send(sock, cmd, 1, DONTWAIT | SNDMORE) < 0:
            err = api.last_error()
            return err if err != 0 else EAGAIN
        api.send(sock, arg, n, DONTWAIT)
        return 0

    cdef int _send_entry(self, uint32_t link, fb_qentry *e) noexcept nogil:
        """Send a queued entry's frames (the socket consumes them): 0, EAGAIN
        (nothing went, or for the XPUB link the records that went are
        counted in e.done), or another errno (the peer is gone)."""
        cdef void *sock = self.sock
        cdef fb_zmq_api *api = self._api(link)
        cdef int i, err, flags
        if link == self._xplink:
            return self._send_records(e)
        if link == self._uplink:
            sock = self._upsock
        elif api.send(sock, self.L.at[link].ident, self.L.at[link].idlen, DONTWAIT | SNDMORE) < 0:
            err = api.last_error()
            return err if err != 0 else EAGAIN
        for i in range(e.nframes):
            flags = DONTWAIT | (SNDMORE if i < e.nframes - 1 else 0)
            if api.msg_send(&e.frames[i], sock, flags) < 0 and i == 0 and link == self._uplink:
                err = api.last_error()
                return err if err != 0 else EAGAIN
        return 0

    cdef int _send_records(self, fb_qentry *e) noexcept nogil:
        """A batch to the XPUB socket, one [channel, payload] message per
        record from e.done on (XPUB filters per subscriber; XPUB_NODROP
        refuses a message while a subscriber's pipe is full)."""
        cdef void *data = Z.msg_data(&e.frames[0])
        cdef size_t len = Z.msg_size(&e.frames[0])
        cdef uint32_t count = 0
        cdef size_t n = 0, i
        cdef fb_record *recs
        cdef int err
        if fb_batch_header(data, len, &count, NULL) < 0 or count == 0:
            return 0
        recs = <fb_record *>malloc(count * sizeof(fb_record))
        if recs is NULL:
            return EAGAIN                          # tried again later
        if fb_batch_decode(data, len, NULL, recs, count, &n) < 0:
            free(recs)
            return 0                               # never: the router made it
        for i in range(e.done, n):
            if Z.send(self._xpsock, recs[i].topic, recs[i].topic_len, DONTWAIT | SNDMORE) < 0:
                err = Z.last_error()
                e.done = <uint32_t>i
                free(recs)
                return EAGAIN if err == EAGAIN or err == 0 else err
            Z.send(self._xpsock, recs[i].payload, recs[i].payload_len, DONTWAIT)
        free(recs)
        return 0

    cdef fb_qentry *_data_entry(self, uint32_t link, unsigned char *buf, size_t len, uint32_t count) noexcept nogil:
        """A queue entry for a batch to a link, as its kind carries it:
        [DATA, seq, batch] (a session), [PUB, batch] (upstream), [batch]
        (the XPUB link); the batch becomes the entry's (NULL for want of
        memory: then it is still the caller's)."""
        cdef fb_qentry *e
        cdef int nhead = 2 if self.L.at[link].session else (1 if link == self._uplink else 0)
        e = fb_qentry_new(&ZM, nhead + 1)
        if e is NULL:
            return NULL
        if nhead == 2:
            if fb_qentry_frame(&ZM, e, 0, FB_CMD_DATA_S, 1) < 0 or fb_qentry_frame(&ZM, e, 1, self.L.at[link].seq, 8) < 0:
                fb_qentry_free(&ZM, e)
                return NULL
        elif nhead == 1 and fb_qentry_frame(&ZM, e, 0, FB_CMD_PUB_S, 1) < 0:
            fb_qentry_free(&ZM, e)
            return NULL
        if fb_qentry_own(&ZM, e, nhead, buf, len) < 0:
            fb_qentry_free(&ZM, e)
            return NULL
        e.records = count if count else 1
        return e

    def wants_reset(self, uint32_t link) -> bool:
        """Does a WANT mark wait at the head of the link's queue (EVENT_WANT
        said so, and the link has not left or started over since)?  Python
        builds the reset only then: building one numbers a change the
        peer will be waited for."""
        return link < self.L.n and self.L.at[link].q.head is not NULL and \
            self.L.at[link].q.head.kind == FB_Q_WANT_MARK

    def fill_want(self, uint32_t link, list frames not None) -> None:
        """The WANT reset that the mark at the head of a link's queue
        stands for (EVENT_WANT), built by Python now: it takes the mark's
        place, and goes when the socket has room.  Ignored if the mark is
        gone (the link left or started over)."""
        cdef fb_link *s
        cdef fb_qentry *e
        cdef fb_qentry *m
        cdef int i, n = len(frames)
        cdef bytes f
        if link >= self.L.n or n < 1 or n > MAX_SEND_FRAMES:
            return
        s = &self.L.at[link]
        m = s.q.head
        if m is NULL or m.kind != FB_Q_WANT_MARK:
            return
        frames = [x if type(x) is bytes else bytes(x) for x in frames]
        e = fb_qentry_new(&ZM, n)
        if e is NULL:
            raise MemoryError()
        e.cmd = FB_CMD_WANT
        for i in range(n):
            f = frames[i]
            if fb_qentry_frame(&ZM, e, i, PyBytes_AS_STRING(f), PyBytes_GET_SIZE(f)) < 0:
                fb_qentry_free(&ZM, e)
                raise MemoryError()
        e.next = m.next
        s.q.head = e
        if s.q.tail is m:
            s.q.tail = e
        s.q.bytes += e.size - m.size
        free(m)                                  # a mark has no frames
        s.q.marks &= ~FB_Q_MARK_WANT
        s.asked = 0
        self._drain_link(link, fb_now_ns())
        self._enforce(link)

    def events(self) -> list:
        """What Python must act on, oldest first: ``(kind, link, value)``
        (EVENT_*: see the module's constants)."""
        cdef uint32_t i
        out = [(self.L.events[i].kind, self.L.events[i].link, self.L.events[i].value) for i in range(self.L.nevents)]
        self.L.nevents = 0
        self.L.flow_asked = 0
        return out

    @property
    def holding(self) -> int:
        """How many links' queues hold publishers back (over flow_bytes)."""
        return self.L.nholding

    @property
    def paused(self) -> bool:
        """Publishers are paused (Python sets it as it tells them): a
        FLOW mark that reaches a queue's head says so."""
        return bool(self.L.paused)

    @paused.setter
    def paused(self, bint value) -> None:
        self.L.paused = value

    @property
    def dropped_slow(self) -> int:
        """Records dropped from slow consumers' queues over max_queue_bytes."""
        return self.L.dropped_slow

    @property
    def blocked(self) -> int:
        """How many links have a queue or a loss to report."""
        return self.L.nblocked

    def held_back(self, bint every: bool = False) -> list:
        """The links holding publishers back (``every``: every link with
        a queue): ``(link, last sent (time.monotonic() s), queued bytes,
        unsent bytes)``, the last what its connection was given and its
        peer has not taken yet (fb_zmtp_server_unsent: falling while the
        peer reads; -1 where the connection is libzmq's)."""
        cdef uint32_t i, link
        cdef fb_link *s
        cdef int64_t unsent
        out = []
        for i in range(self.L.nblocked):
            link = self.L.blocked[i]
            s = &self.L.at[link]
            if s.holding or (every and not s.gone and s.q.bytes):
                unsent = fb_zmtp_server_unsent(self._srv, s.ident, s.idlen) if self._srv is not NULL else -1
                out.append((link, s.last_sent_ns / 1e9, s.q.bytes, unsent))
        return out

    def kick_stuck(self, uint32_t link) -> bool:
        """Disconnect a session that took nothing for too long while
        messages waited for it, as a slow consumer (EVENT_SLOW, reason
        2); False if the link is no live session."""
        if link >= self.L.n or self.L.at[link].gone or not self.L.at[link].session:
            return False
        self._kick(link, 2)
        return True

    def exempt(self, uint32_t link) -> None:
        """The link no longer holds publishers back (it took nothing for
        too long while they waited), until its queue drains."""
        if link < self.L.n:
            fb_links_exempt(&self.L, link)

    def queue_state(self, uint32_t link) -> tuple:
        """``(queued bytes, blocked, holding publishers back, exempt, lost
        and not yet reported, last sent (time.monotonic() s))``."""
        cdef fb_link *s
        if link >= self.L.n:
            return (0, False, False, False, 0, 0.0)
        s = &self.L.at[link]
        return (s.q.bytes, bool(s.blocked), bool(s.holding), bool(s.exempt), s.q.lost, s.last_sent_ns / 1e9)

    @property
    def queued_bytes(self) -> int:
        """What every link's queue holds."""
        cdef uint32_t i
        cdef size_t total = 0
        for i in range(self.L.nblocked):
            total += self.L.at[self.L.blocked[i]].q.bytes
        return total

    def flush_link(self, uint32_t link) -> None:
        """Send (or queue) the batch a link's outbox holds, due or not."""
        with nogil:
            self._send_links(&link, 1, fb_now_ns())

    def flush_links(self, list links not None) -> None:
        """flush_link for each (outboxes a batch Python routed filled)."""
        cdef uint32_t link
        for x in links:
            link = x
            with nogil:
                self._send_links(&link, 1, fb_now_ns())

    def flush_all(self) -> None:
        """On stop: every outbox's batch, due or not, and one more try of
        the queues."""
        cdef size_t n
        cdef int rounds = 0
        with nogil:
            while rounds < 64:
                n = self.router.dp_pending(self._links, LINKS_PER_CALL)
                if not n:
                    break
                self._send_links(self._links, n, fb_now_ns())
                rounds += 1
            self._drain(fb_now_ns())

    # -- the data plane ---------------------------------------------------------

    def wait(self, list others not None, long timeout_ms, bint once=False) -> list:
        """The broker's poll, in C: wait up to ``timeout_ms`` for work that
        needs Python, routing and sending known sessions' PUBs meanwhile
        without the interpreter lock (so no Python thread, in the broker's
        process or in its own loop, stands between a PUB and its DATA).

        ``others`` are the other sockets (pyzmq sockets) and descriptors
        (ints) the loop watches.  Returns their indices that are readable,
        and -1 first when the ROUTER socket holds a message for Python
        (``receive()`` returns it first).  It also returns, with an empty
        list, once events wait for Python (``events()``), when
        ``timeout_ms`` has passed, on a signal, and with ``once`` after
        the first turn that routed anything (for a loop that has per-turn
        work: a flow pause).  Meanwhile it retries the queues of links
        whose sockets were full, as they take more.  A terminated context
        raises zmq.ContextTerminated, as pyzmq's poll does."""
        cdef fb_zmq_pollitem items[MAX_WAITED + 1 + BLOCKED_SOCKETS]
        cdef int n = len(others), i, found
        cdef uint64_t deadline
        if n > MAX_WAITED:
            raise ValueError(f"wait() watches at most {MAX_WAITED} sockets and descriptors besides the ROUTER")
        if self._slow is not None:
            return [-1]
        self._upidx = 0
        if self._srv is not NULL:
            items[0].socket = NULL             # a Listener: its descriptor
            items[0].fd = self._fds[0]
        else:
            items[0].socket = self.sock
            items[0].fd = 0
        items[0].events = POLLIN
        items[0].revents = 0
        for i in range(n):
            o = others[i]
            if isinstance(o, int):
                items[i + 1].socket = NULL
                items[i + 1].fd = o
            elif self._upnative and o is self._uppysock:
                items[i + 1].socket = NULL         # a Stream: its descriptor
                items[i + 1].fd = self._fds[1]
                self._upidx = i + 1
            else:
                items[i + 1].socket = <void *><uintptr_t>o.underlying
                items[i + 1].fd = 0
                if items[i + 1].socket == self._upsock and self._upsock is not NULL:
                    self._upidx = i + 1
            items[i + 1].events = POLLIN
            items[i + 1].revents = 0
        if self._nup and self._upidx:
            return [self._upidx - 1]               # upstream's message still waits for Python
        deadline = fb_now_ns() + <uint64_t>(timeout_ms if timeout_ms > 0 else 0) * 1000000u
        with nogil:
            found = self._run(items, n + 1, deadline, once)
        if found & FOUND_ERROR and self._errno != EINTR:
            # The context was terminated (the old poll raised the same), or
            # a socket closed under us: never a loop that spins on it.
            if self._errno == zmq.ETERM:
                raise zmq.ContextTerminated(self._errno)
            raise zmq.ZMQError(self._errno)
        ready = []
        if found & FOUND_MESSAGE:
            self._slow = self._take_parts()
            ready.append(-1)
        if found & FOUND_OTHERS:
            for i in range(n):
                if items[i + 1].revents & POLLIN and (i + 1 != self._upidx or self._nup):
                    ready.append(i)
        return ready

    cdef int _run(self, fb_zmq_pollitem *items, int n, uint64_t deadline, bint once) noexcept nogil:
        """wait()'s loop (see there): poll, read and route what the ROUTER
        has, send what is due, retry blocked links' queues, until
        something is Python's.  ``items`` has room for BLOCKED_SOCKETS
        more: while links are blocked, the descriptors that signal their
        sockets' commands (libzmq says "a full pipe has room" with one)."""
        cdef uint64_t now, due
        cdef long ms
        cdef int rc, i, got, found, nitems, k
        while True:
            if self._journal is not NULL:
                _j_commit(self)                  # what this turn routed, journaled before it goes
                if self._jcompact_at and fb_journal_disk_bytes(self._journal, NULL) >= self._jcompact_at:
                    self._jcompact_at = 0
                    self.journal_due = True
                    return FOUND_EVENTS          # (Python's turn: its compaction)
            if self.L.nblocked:
                self._drain(fb_now_ns())
            if self.L.nevents:
                return FOUND_EVENTS
            now = fb_now_ns()
            due = self.router.dp_deadline()          # a lingering batch (0: none)
            if due > deadline:
                due = deadline
            ms = 0 if due <= now else <long>((due - now + 999999u) // 1000000u)
            if self._srv is not NULL and fb_zmtp_server_buffered(self._srv):
                ms = 0                         # input a Listener already read (its descriptor does not show it)
            if self._up_buffered():
                ms = 0                         # ... or the upstream Stream
            nitems = n
            if self.L.nblocked:
                if ms > BACKSTOP_MS:
                    ms = BACKSTOP_MS
                for k in range(BLOCKED_SOCKETS):
                    if self._fds[k] >= 0:
                        items[nitems].socket = NULL
                        items[nitems].fd = self._fds[k]
                        items[nitems].events = POLLIN
                        items[nitems].revents = 0
                        nitems += 1
            rc = Z.poll(items, nitems, ms)
            if rc < 0:
                self._errno = Z.last_error()
                return FOUND_ERROR
            found = 0
            got = 0
            for i in range(1, n):
                if items[i].revents & POLLIN or (i == self._upidx and self._up_buffered()):
                    if i == self._upidx:
                        # Upstream's DATA is routed here; Python is woken
                        # only for a message of its own.
                        got += self._read_up(self.budget)
                        if self._nup:
                            found = FOUND_OTHERS
                    else:
                        found = FOUND_OTHERS
            if items[0].revents & POLLIN or (self._srv is not NULL and fb_zmtp_server_buffered(self._srv)):
                got += self._read(self.budget, &found)
            self._send_due(fb_now_ns())
            if self.L.nevents:
                found |= FOUND_EVENTS
            if found:
                return found
            if once and got:
                return FOUND_ACTIVITY
            if fb_now_ns() >= deadline:
                return 0

    cdef int _read(self, int budget, int *found) noexcept nogil:
        """Read and route up to ``budget`` messages until one is Python's
        (kept in self._parts: FOUND_MESSAGE) or events wait for Python (a
        flow pause goes out before more is read); the number read."""
        cdef int got = 0, n, i
        while got < budget and not self.L.nevents:
            n = self._recv(self._parts)
            if n == 0:
                break
            got += 1
            if self._route(self._parts, n):
                for i in range(n):
                    self.R.msg_close(&self._parts[i])
                continue
            self._nparts = n
            found[0] |= FOUND_MESSAGE
            break
        if self._srv is not NULL:
            self._take_gone()
        return got

    cdef void _take_gone(self) noexcept nogil:
        """Connections the Listener lost, once all they sent was read:
        their links are lost now (a resumable session starts to linger),
        not at the next send to them.  An id no link has (one that left
        saying BYE, or whose session resumed on a new connection) is
        nothing to do."""
        cdef unsigned char id[FB_ZMTP_SERVER_ID_LEN]
        cdef int n
        cdef uint32_t link
        while True:
            n = fb_zmtp_server_take_gone(self._srv, id)
            if n == 0:
                return
            link = fb_links_find(&self.L, id, <size_t>n)
            if link != UINT32_MAX and link < self.L.n and self.L.at[link].session:
                fb_links_lose(&self.L, link, EVENT_GONE, 0, &ZM)

    cdef bint _route(self, fb_zmq_msg *parts, int n) noexcept nogil:
        """A known session's PUB: route it here (an outbox it fills goes
        at once) and return True.  False for a message Python must see:
        any other, and a PUB the router refused (rc < 0) or took only in
        part (records over the size limits): self._rc and self._over say
        which."""
        cdef uint8_t *cmd
        cdef uint32_t link
        cdef int rc
        cdef uint64_t over
        cdef fb_zmq_api *R = &self.R
        self._rc = 0
        self._over = 0
        if (n == 3 or n == 4) and R.msg_size(&parts[1]) == 1 and (<uint8_t *>R.msg_data(&parts[1]))[0] == FB_CMD_PING:
            return self._ping(parts, n)
        if n != 3 or R.msg_size(&parts[1]) != 1:
            return False
        cmd = <uint8_t *>R.msg_data(&parts[1])
        if cmd[0] != FB_CMD_PUB:
            return False
        link = fb_links_find(&self.L, <const uint8_t *>R.msg_data(&parts[0]), R.msg_size(&parts[0]))
        if link == UINT32_MAX:
            return False
        self.L.at[link].received += 1
        self.L.at[link].received_bytes += R.msg_size(&parts[2])
        if self._journal is not NULL:
            _j_mark(self, link)                  # (TOOK once a commit covers it: _j_commit)
        elif self.L.at[link].resumable and \
                (self.L.at[link].received - self.L.at[link].received_told >= TOOK_EVERY or
                 self.L.at[link].received_bytes >= TOOK_BYTES):
            self._tell_took(link, False)
        rc = self._route_batch(link, R.msg_data(&parts[2]), R.msg_size(&parts[2]), &over)
        if self._srv is not NULL:
            fb_zmtp_server_routed(self._srv, self._delivered, over)   # (a Redis client's PUBLISH: its reply)
        if rc < 0 or over:
            # The router refused the batch (Python drops the sender with
            # the reason), or dropped records over the limits (Python
            # tells the sender); it counted either.
            self._rc = rc
            self._over = over
            return False
        return True

    cdef int _route_batch(self, uint32_t link, void *data, size_t len, uint64_t *over_out) noexcept nogil:
        """Route a batch received from ``link``, count it, and send the
        outboxes it filled: the router's status (records routed, or < 0
        if it refused the batch); ``over_out``: records it dropped over
        the size limits."""
        cdef int rc
        cdef size_t nfull = 0
        cdef uint64_t over
        rc = self.router.dp_route(link, <const void *>data, len, fb_now_ns(), self._links, LINKS_PER_CALL,
                                  &nfull, &over, &self._delivered)
        if rc >= 0:
            self._count_routed(&self.L.at[link], <uint64_t>rc, len)
        if nfull:
            self._send_links(self._links, nfull, fb_now_ns())
        over_out[0] = over if rc >= 0 else 0
        return rc

    cdef int _read_up(self, int budget) noexcept nogil:
        """Read the upstream's socket: route each [DATA, seq, batch] here,
        keep the first other message (or a DATA the router refused) for
        Python (self._up), and stop there; the number read."""
        cdef int got = 0, n, rc, i
        cdef uint64_t over
        cdef uint32_t count
        cdef fb_zmq_api *U = &self.U
        cdef size_t size
        while got < budget and not self._nup and not self.L.nevents:
            n = self._recv_on(U, self._upsock, self._upv)
            if n == 0:
                break
            got += 1
            if n == 3 and U.msg_size(&self._upv[0]) == 1 and (<uint8_t *>U.msg_data(&self._upv[0]))[0] == FB_CMD_DATA:
                rc = self._route_batch(self._uplink, U.msg_data(&self._upv[2]), U.msg_size(&self._upv[2]), &over)
                if rc >= 0:
                    count = 0
                    fb_batch_header(<const unsigned char *>U.msg_data(&self._upv[2]), U.msg_size(&self._upv[2]),
                                    &count, NULL)
                    self.up_records += count
                    for i in range(n):
                        U.msg_close(&self._upv[i])
                    continue
                self._uprc = rc
            else:
                self._uprc = 0
            # Kept for Python as a copy: a Stream's frames are views that
            # the next call on it may end (a send included).
            for i in range(n):
                size = U.msg_size(&self._upv[i])
                if Z.msg_init_size(&self._up[i], size) == 0:
                    memcpy(Z.msg_data(&self._up[i]), U.msg_data(&self._upv[i]), size)
                else:
                    Z.msg_init(&self._up[i])      # (no memory: an empty frame, which Python refuses)
                U.msg_close(&self._upv[i])
            self._nup = n
        return got

    def take_upstream(self) -> list | UpstreamRefused | None:
        """The message from upstream that wait() kept for Python (its
        frames, bytes), or None; for a DATA the router refused, an
        :class:`UpstreamRefused`."""
        cdef int i, n = self._nup
        cdef UpstreamRefused refused
        if not n:
            return None
        if self._uprc < 0:
            refused = UpstreamRefused.__new__(UpstreamRefused)
            refused.status = self._uprc
            frames = refused
        else:
            frames = [PyBytes_FromStringAndSize(<char *>Z.msg_data(&self._up[i]), Z.msg_size(&self._up[i]))
                      for i in range(n)]
        for i in range(n):
            Z.msg_close(&self._up[i])
        self._nup = 0
        self._uprc = 0
        return frames

    cdef bint _ping(self, fb_zmq_msg *parts, int n) noexcept nogil:
        """A known session's PING: ``[ident, PING, token]`` (liveness, or a
        flush's marker: every client sends one a ``ping_interval``) or,
        from a session that acknowledges, a lease ping ``[ident, PING,
        token, LEASE_ASK]`` (each filtering publisher, ten to twenty a
        second).  Answer ``[PONG, token, instance]`` here, with the lease's
        µs for a lease ping (the grant recorded, as Python would:
        fastbus.broker.sessions), and return True.  The PONG goes behind
        the DATA routed to the session before the PING (its outbox is sent
        first) and behind what waits in its queue (WANT included: the
        lease is on the view those give it): csrc/fb_leases.h.  False (Python answers) for
        an unknown peer, a lease ping from a peer without "ack" or before
        Python said the lease, and for want of memory."""
        cdef uint32_t link
        cdef fb_link *s
        cdef int rc
        cdef fb_zmq_api *R = &self.R
        if not self._leases.instlen:
            return False                       # Python has not said the instance yet
        link = fb_links_find(&self.L, <const uint8_t *>R.msg_data(&parts[0]), R.msg_size(&parts[0]))
        if link == UINT32_MAX:
            return False
        s = &self.L.at[link]
        if n == 4 and (not self._leases.lease_ns or not s.acks):
            return False                       # (before the outbox goes: Python answers this one)
        # What was routed to it before this PING goes first.
        self._send_links(&link, 1, fb_now_ns())
        if s.gone:
            return True                        # leaving: Python removes it this turn
        if s.resumable and s.received != s.received_told:
            self._tell_took(link, True)           # (a flush's PONG finds what it covers acknowledged)
        rc = fb_leases_pong(&self._leases, s, R, self.sock, &ZM, R.msg_data(&parts[2]), R.msg_size(&parts[2]),
                            R.msg_data(&parts[3]) if n == 4 else NULL, R.msg_size(&parts[3]) if n == 4 else 0,
                            fb_now_ns())
        if rc == FB_PONG_QUEUED:
            self._queued(link, QUEUED)
        elif rc == FB_PONG_GONE:
            fb_links_lose(&self.L, link, EVENT_GONE, 0, &ZM)
        return rc != FB_PONG_NOT

    cdef tuple _take_parts(self):
        """The message _read kept for Python, as ``(frames, meta)``,
        frames a PubRouted for a PUB routed in part or refused (see
        receive); its parts are closed."""
        cdef int i, n = self._nparts
        cdef PubRouted routed
        meta = None
        if self._rc < 0 or self._over:
            routed = PubRouted.__new__(PubRouted)
            routed.ident = PyBytes_FromStringAndSize(<char *>self.R.msg_data(&self._parts[0]), self.R.msg_size(&self._parts[0]))
            routed.status = self._rc
            routed.over = self._over
            frames = routed
        else:
            frames = [PyBytes_FromStringAndSize(<char *>self.R.msg_data(&self._parts[i]), self.R.msg_size(&self._parts[i]))
                      for i in range(n)]
            if n >= 2 and frames[1] == P.HELLO:
                meta = {"Peer-Address": _prop(&self.R, &self._parts[1], b"Peer-Address"),
                        "User-Id": _prop(&self.R, &self._parts[1], b"User-Id")}
        for i in range(n):
            self.R.msg_close(&self._parts[i])
        self._nparts = 0
        return frames, meta

    def receive(self, int budget) -> tuple:
        """Read up to ``budget`` messages, routing each known session's PUB
        here, until one needs Python: that one is returned, in order (a
        message wait() found comes first).  Before returning, what was
        routed goes out (each link its due batch; an outbox that fills
        goes at once), so a message leaves in the call that read it.
        Returns ``(frames or None, meta, messages read)``.  ``frames`` is a
        message's frames (bytes), or for a known session's PUB
        a :class:`PubRouted` (the router refused the batch, or routed it
        without the records over the size limits).  ``meta`` is, for a HELLO,
        the connection's ``{"Peer-Address": ..., "User-Id": ...}``
        (ZeroMQ's message properties; None where unknown), else None.

        Batches a link's socket will not take wait in its queue (the
        slow-consumer policy bounds it); reading stops while events wait
        for Python, so a flow pause goes out before more is read."""
        cdef int got, found = 0
        if self._slow is not None:
            frames, meta = self._slow
            self._slow = None
            return frames, meta, 0
        with nogil:
            got = self._read(budget, &found)
            self._send_due(fb_now_ns())
        if found & FOUND_MESSAGE:
            frames, meta = self._take_parts()
            return frames, meta, got
        return None, None, got

    cdef int _recv(self, fb_zmq_msg *parts) noexcept nogil:
        """Read one message from the ROUTER socket (see _recv_on)."""
        return self._recv_on(&self.R, self.sock, parts)

    cdef int _recv_on(self, fb_zmq_api *api, void *sock, fb_zmq_msg *parts) noexcept nogil:
        """Read one message (``api``: the socket's calls): its frame count
        (at most MAX_PARTS kept; the rest read and dropped), 0 if none is
        waiting."""
        cdef int n = 0
        cdef fb_zmq_msg extra
        api.msg_init(&parts[0])
        if api.msg_recv(&parts[0], sock, DONTWAIT) < 0:
            api.msg_close(&parts[0])
            return 0
        n = 1
        while api.msg_more(&parts[n - 1]):
            if n == MAX_PARTS:
                # Too many frames: keep what we have (Python refuses the
                # message) and drop the rest, so the next read starts clean.
                api.msg_init(&extra)
                while api.msg_recv(&extra, sock, DONTWAIT) >= 0 and api.msg_more(&extra):
                    api.msg_close(&extra)
                    api.msg_init(&extra)
                api.msg_close(&extra)
                return n
            api.msg_init(&parts[n])
            if api.msg_recv(&parts[n], sock, DONTWAIT) < 0:
                api.msg_close(&parts[n])
                return n
            n += 1
        return n

    def flush(self) -> None:
        """Send (or queue) every batch that is due."""
        with nogil:
            self._send_due(fb_now_ns())

    cdef void _send_due(self, uint64_t now) noexcept nogil:
        cdef size_t n
        while True:
            n = self.router.dp_due(now, self._links, LINKS_PER_CALL)
            if n:
                self._send_links(self._links, n, now)
            if n < LINKS_PER_CALL:
                return

    cdef void _send_links(self, uint32_t *links, size_t n, uint64_t now) noexcept nogil:
        """Take each link's batch from the router and send it, or queue it
        behind what waits for the link (the queue's policy applies)."""
        cdef size_t k
        cdef uint32_t link, count
        cdef unsigned char *buf
        cdef size_t len
        cdef int rc
        cdef fb_link *s
        cdef fb_qentry *e
        cdef bint journaled
        for k in range(n):
            link = links[k]
            buf = NULL
            len = 0
            rc = self.router.dp_take(link, now, &buf, &len)
            if rc < 0 or buf is NULL:
                continue                      # FB_ENOMEM: the batch stays for the next turn
            count = 0
            fb_batch_header(buf, len, &count, NULL)
            if link >= self.L.n or self.L.at[link].gone or \
                    not (self.L.at[link].session or link == self._uplink or link == self._xplink):
                fb_free(buf)                  # a link that is leaving (Python removes it this turn)
                continue
            s = &self.L.at[link]
            journaled = self._journal is not NULL and s.jhas and s.resumable
            if journaled and _j_batch(self, s, buf, len, count) < 0:
                self.journal_errors += 1         # (no memory: it goes unjournaled)
            if s.q.head is NULL and not s.q.lost and link != self._xplink and not s.detached and not journaled:
                if link == self._uplink:
                    rc = self._send_pub(self._upsock, buf, len)
                else:
                    rc = self._send_data(s, buf, len, count)
                if rc == 0:
                    self._count_sent(s, count, len)
                    s.last_sent_ns = now
                    continue
                if rc != EAGAIN:
                    fb_links_lose(&self.L, link, EVENT_GONE, 0, &ZM)
                    if s.gone:
                        fb_free(buf)
                        continue
                    # detached: the batch waits for the resume (below)
            e = self._data_entry(link, buf, len, count)
            if e is NULL:
                # No memory to keep it: lost, and reported as a slow
                # consumer's loss is (GAP).
                fb_free(buf)
                self.dropped += count
                s.q.lost += count
                fb_links_block(&self.L, link)
                continue
            if link == self._xplink and s.q.head is NULL and not s.q.lost:
                rc = self._send_records(e)
                if rc == 0:
                    self._count_sent(s, count, len)
                    s.last_sent_ns = now
                    fb_qentry_free(&ZM, e)
                    continue
            self._enqueue(link, e)

    # The books: the broker's totals and the link's, per batch.

    cdef void _count_routed(self, fb_link *s, uint64_t records, size_t len) noexcept nogil:
        self.batches_in += 1
        self.messages_in += records
        self.bytes_in += len
        s.batches_in += 1
        s.messages_in += records
        s.bytes_in += len

    cdef void _count_sent(self, fb_link *s, uint64_t records, size_t len) noexcept nogil:
        self.batches_out += 1
        self.messages_out += records
        self.bytes_out += len
        s.batches_out += 1
        s.messages_out += records
        s.bytes_out += len

    cdef int _send_data(self, fb_link *s, unsigned char *buf, size_t len, uint32_t count) noexcept nogil:
        """[ident, DATA, seq, batch]: 0 when sent (the batch is then libzmq's
        or freed, or a resumable session's ring's), else the errno (the
        batch is still ours).  Only the routing id can fail
        (ROUTER_MANDATORY: EAGAIN for a full pipe, EHOSTUNREACH for a peer
        that left); the other frames follow it."""
        cdef fb_zmq_msg m
        cdef int err
        if self.R.send(self.sock, s.ident, s.idlen, DONTWAIT | SNDMORE) < 0:
            err = self.R.last_error()
            return err if err != 0 else EAGAIN
        self.R.send(self.sock, FB_CMD_DATA_S, 1, DONTWAIT | SNDMORE)
        self.R.send(self.sock, s.seq, 8, DONTWAIT | SNDMORE)
        if s.resumable:
            # Copied into the connection, and kept for a resume.
            self.R.send(self.sock, buf, len, DONTWAIT)
            self._retain_sent(s, buf, len, count if count else 1, s.seq)
        elif len <= COPY_MAX:
            self.R.send(self.sock, buf, len, DONTWAIT)
            fb_free(buf)
        else:
            Z.msg_init_data(&m, buf, len, _free_batch, NULL)
            if self.R.msg_send(&m, self.sock, DONTWAIT) < 0:
                Z.msg_close(&m)               # frees the batch
        return 0

    cdef int _send_pub(self, void *sock, unsigned char *buf, size_t len) noexcept nogil:
        """[PUB, batch] on a DEALER socket (the upstream broker's), as
        _send_data: 0 when sent, else the errno (the batch still ours).
        Only the first frame can fail (EAGAIN: its pipe is full); the
        batch follows it."""
        cdef fb_zmq_msg m
        cdef int err
        if self.U.send(sock, FB_CMD_PUB_S, 1, DONTWAIT | SNDMORE) < 0:
            err = self.U.last_error()
            return err if err != 0 else EAGAIN
        if len <= COPY_MAX or self._upnative:
            self.U.send(sock, buf, len, DONTWAIT)     # (a Stream copies what it sends)
            fb_free(buf)
        else:
            Z.msg_init_data(&m, buf, len, _free_batch, NULL)
            if Z.msg_send(&m, sock, DONTWAIT) < 0:
                Z.msg_close(&m)               # frees the batch
        return 0

    def link_counters(self) -> dict:
        """Each link's traffic since it was added (the relay's and what
        Python counted in): ``{link: (batches_in, messages_in, bytes_in,
        batches_out, messages_out, bytes_out)}``, for sessions and links
        with traffic (one walk of the slots; the broker calls it when it
        builds a monitoring snapshot, about once a second)."""
        cdef uint32_t i
        cdef fb_link *s
        out = {}
        for i in range(self.L.n):
            s = &self.L.at[i]
            if s.session or s.batches_in or s.batches_out:
                out[i] = (s.batches_in, s.messages_in, s.bytes_in, s.batches_out, s.messages_out, s.bytes_out)
        return out


include "_journal.pxi"
