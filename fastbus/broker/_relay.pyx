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
Everything else (HELLO, SUB, an ACK, a PUB from an unknown peer, a
batch the decoder refuses) is handed back to Python as a list of frames, and so is
every batch the relay does not send itself: to a link that is neither a
session on this socket nor the upstream broker (whose DEALER socket,
``set_upstream``, takes ``[PUB, batch]``), such as the XPUB socket's; to one the router holds
(Python queues for it: its socket was full, or it owes it a loss notice),
and any send that fails (EAGAIN, EHOSTUNREACH).  So the Python
broker keeps every policy (queues, slow consumers, flow control, errors);
the relay only takes the common path.

It calls libzmq directly, through the functions of the libzmq that pyzmq
loaded (``fastbus.broker._libzmq`` finds them; a socket handle is only
valid in the library instance that made it).  Where they cannot be found,
the broker does not start: there is one data plane.  Only the broker's own
thread uses a Relay, as it does the socket.
"""

from libc.errno cimport EAGAIN, EHOSTUNREACH, EINTR
from libc.stdint cimport uint8_t, uint32_t, uint64_t, uintptr_t, UINT32_MAX
from libc.stdlib cimport calloc, free, realloc
from libc.string cimport memcmp, memcpy, memset
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE

from fastbus._core cimport Batch, Router
from fastbus.includes.fb_batch cimport fb_batch_header
from fastbus.includes.fb_common cimport fb_free, fb_now_ns
from fastbus.includes.fb_lock cimport fb_lock, fb_lock_try, fb_lock_release, fb_lock_wait
from fastbus.includes.fb_router cimport (fb_router_deadline, fb_router_due, fb_router_full, fb_router_get_stats, fb_router_held,
                                         fb_router_route, fb_router_stats, fb_router_take)

import zmq

include "_zmq_calls.pxi"

cdef enum:
    DONTWAIT = 1                 # ZMQ_DONTWAIT
    SNDMORE = 2                  # ZMQ_SNDMORE
    MAX_PARTS = 8                # frames read of one message; more is a protocol error (Python's)
    LINKS_PER_CALL = 4096
    COPY_MAX = 8192              # batches up to this size are copied; larger ones handed to libzmq
    IDENT_MAX = 255              # ZeroMQ routing ids are 1..255 bytes
    INSTANCE_MAX = 64            # the broker instance id a PONG carries (protocol.new_instance_id: 16)
    POLLIN = 1                   # ZMQ_POLLIN
    MAX_WAITED = 64              # sockets and descriptors wait() watches besides the ROUTER
    # What wait() found (bits of _run's result).
    FOUND_MESSAGE = 1            # a message for Python (receive() returns it first)
    FOUND_LEFTOVERS = 2          # batches for Python to send (flush())
    FOUND_OTHERS = 4             # another socket or descriptor is readable
    FOUND_ACTIVITY = 8           # a message was routed (wait(once=True) returns)
    FOUND_ERROR = 16             # zmq_poll failed (EINTR: a signal for Python; else wait() raises)


cdef void _free_batch(void *data, void *hint) noexcept nogil:
    # Called by libzmq (its I/O thread) when it is done with a batch.
    fb_free(data)


cdef object _prop(fbz_msg *msg, const char *name):
    """A message property (ZeroMQ metadata of its connection), or None."""
    cdef const char *v = Z.msg_gets(msg, name)
    return None if v is NULL else v.decode("utf-8", "replace")


cdef inline void _lock(fb_lock *l) noexcept nogil:
    if not fb_lock_try(l):
        fb_lock_wait(l)


cdef struct slot:
    uint8_t session               # a session on this socket: the relay sends its batches
    uint8_t deferred              # a send to it failed this turn: the rest waits for Python too
    uint8_t acks                  # it said "ack" in HELLO: it filters under our lease, asked for by lease pings
    uint8_t idlen
    uint8_t ident[IDENT_MAX]
    uint8_t seq[8]                # the DATA frame's seq, little-endian
    # The link's traffic, per batch (never per message): batches routed
    # from it and sent to it, by the relay itself or by Python (count_in,
    # count_out), for any kind of link: the broker's one set of books.
    uint64_t batches_in, messages_in, bytes_in, batches_out, messages_out, bytes_out
    uint64_t lease_end_ns         # the latest end of a lease granted it, here or by grant() (fb_now_ns's clock)


cdef struct pend:
    # A batch the relay leaves for Python to send (flush()).
    uint32_t link
    uint32_t count
    unsigned char *buf
    size_t len


cdef inline uint32_t _hash(const uint8_t *p, size_t n) noexcept nogil:
    cdef uint32_t h = 2166136261u
    cdef size_t i
    for i in range(n):
        h = (h ^ p[i]) * 16777619u
    return h


cdef class Relay:
    """The data plane of one broker's ROUTER socket (see the module doc).

    ``wait(others, timeout_ms)`` is the broker's poll: it routes and sends
    known sessions' PUBs in C until something is Python's.
    ``receive(budget)`` reads, routes and sends until a message is not a
    known session's PUB, and returns that one; ``flush()`` sends every due
    batch and returns ``(link, batch, records)`` for those Python must
    send.  Counters of the broker's traffic, the relay's and what Python
    reports (``count_in``, ``count_out``): ``batches_in``, ``messages_in``,
    ``bytes_in`` (routed from a link), ``batches_out``, ``messages_out``,
    ``bytes_out`` (sent), per link in ``link_counters()``; ``dropped``
    (records of batches lost for want of memory to keep them)."""

    cdef Router router
    cdef object pysock            # keeps the socket (and its handle) alive
    cdef void *sock
    cdef slot *slots
    cdef uint32_t nslots
    cdef uint32_t *table          # open addressing: link + 1, 0 empty, UINT32_MAX a tombstone
    cdef uint32_t tcap, tused
    cdef pend *_pend              # batches left for Python (flush())
    cdef size_t _npend, _pcap, _pend_bytes
    cdef fbz_msg _parts[MAX_PARTS]  # a message read for Python, until taken
    cdef int _nparts
    cdef int _rc                  # of that message, if a PUB: the router's status
    cdef uint64_t _over           # ... and the records it dropped over the limits
    cdef object _slow             # that message as (frames, meta), for receive()
    cdef int _errno               # of a failed zmq_poll
    cdef uint32_t _links[LINKS_PER_CALL]
    cdef uint32_t _uplink         # the upstream broker's link (UINT32_MAX: none)
    cdef void *_upsock            # ... and its DEALER socket
    cdef object _uppysock         # (kept alive)
    cdef int _upidx               # that socket's item in wait()'s poll (0: not watched)
    cdef fbz_msg _up[MAX_PARTS]   # a message from upstream read for Python, until taken
    cdef int _nup
    cdef int _uprc                # of that message, if a DATA: the router's status
    cdef public uint64_t batches_in, messages_in, bytes_in, batches_out, messages_out, bytes_out, dropped
    #: PINGs the relay answered itself (control messages Python did not
    #: see), and how many of them were lease pings it granted a lease.
    cdef public uint64_t pings_answered, leases_granted
    cdef uint64_t _lease_ns       # the lease a PONG grants (0: Python answers lease pings)
    cdef uint8_t _instance[INSTANCE_MAX]
    cdef size_t _instlen
    #: Reading stops once the batches left for Python hold this many bytes
    #: (see receive).
    cdef public size_t leftover_limit
    #: wait() reads at most this many messages before polling again.
    cdef public int budget

    def __cinit__(self, Router router not None, sock not None):
        if not _bound:
            raise RuntimeError("fastbus.broker._relay: the libzmq functions are not bound")
        self.router = router
        self.pysock = sock
        self.sock = <void *><uintptr_t>sock.underlying
        self.tcap = 64
        self.table = <uint32_t *>calloc(self.tcap, sizeof(uint32_t))
        if self.table is NULL:
            raise MemoryError()
        self.leftover_limit = 4 << 20
        self.budget = 256
        self._uplink = UINT32_MAX

    def __dealloc__(self):
        cdef size_t k
        cdef int i
        for k in range(self._npend):
            fb_free(self._pend[k].buf)
        for i in range(self._nparts):
            Z.msg_close(&self._parts[i])
        for i in range(self._nup):
            Z.msg_close(&self._up[i])
        free(self._pend)
        free(self.slots)
        free(self.table)

    # -- sessions ----------------------------------------------------------------

    cdef int _grow_slots(self, uint32_t link) except -1:
        cdef uint32_t n
        cdef slot *p
        if link < self.nslots:
            return 0
        n = self.nslots * 2 if self.nslots else 64
        while n <= link:
            n *= 2
        p = <slot *>realloc(self.slots, n * sizeof(slot))
        if p is NULL:
            raise MemoryError()
        memset(p + self.nslots, 0, (n - self.nslots) * sizeof(slot))
        self.slots = p
        self.nslots = n
        return 0

    cdef uint32_t _find(self, const uint8_t *ident, size_t n) noexcept nogil:
        """The link of a routing id, or UINT32_MAX."""
        cdef uint32_t mask = self.tcap - 1
        cdef uint32_t i = _hash(ident, n) & mask
        cdef uint32_t v
        cdef slot *s
        while True:
            v = self.table[i]
            if v == 0:
                return UINT32_MAX
            if v != UINT32_MAX:
                s = &self.slots[v - 1]
                if s.idlen == n and memcmp(s.ident, ident, n) == 0:
                    return v - 1
            i = (i + 1) & mask

    cdef int _rehash(self) except -1:
        """A table for the live routing ids, at most a quarter full (and
        without the tombstones that sessions leaving left)."""
        cdef uint32_t *old = self.table
        cdef uint32_t oldcap = self.tcap, k, v, i, live = 0, cap = 64
        cdef slot *s
        for k in range(oldcap):
            if old[k] != 0 and old[k] != UINT32_MAX:
                live += 1
        while cap < 4 * (live + 1):
            cap *= 2
        self.table = <uint32_t *>calloc(cap, sizeof(uint32_t))
        if self.table is NULL:
            self.table = old
            raise MemoryError()
        self.tcap = cap
        self.tused = 0
        for k in range(oldcap):
            v = old[k]
            if v != 0 and v != UINT32_MAX:
                s = &self.slots[v - 1]
                i = _hash(s.ident, s.idlen) & (cap - 1)
                while self.table[i] != 0:
                    i = (i + 1) & (cap - 1)
                self.table[i] = v
                self.tused += 1
        free(old)
        return 0

    cdef void _unlink(self, uint32_t link) noexcept nogil:
        """Take a link's routing id out of the table."""
        cdef uint32_t mask = self.tcap - 1
        cdef slot *s = &self.slots[link]
        cdef uint32_t i = _hash(s.ident, s.idlen) & mask
        cdef uint32_t v
        while True:
            v = self.table[i]
            if v == 0:
                return
            if v == link + 1:
                self.table[i] = UINT32_MAX
                return
            i = (i + 1) & mask

    def add_session(self, uint32_t link, bytes ident not None, uint64_t seq=0, bint acks=False) -> None:
        """A session on this socket: its batches go as [ident, DATA, seq, batch].
        ``acks``: it said "ack" in HELLO (its lease pings are answered here)."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(ident)
        cdef uint32_t other
        if n < 1 or n > IDENT_MAX:
            raise ValueError(f"a routing id has 1 to {IDENT_MAX} bytes, not {n}")
        if link >= UINT32_MAX - 1:
            raise ValueError("link id out of range")
        self._grow_slots(link)
        if self.slots[link].session:
            self._unlink(link)
        other = self._find(<const uint8_t *>PyBytes_AS_STRING(ident), n)
        if other != UINT32_MAX:
            self._unlink(other)
            self.slots[other].session = 0
        if (self.tused + 1) * 2 > self.tcap:
            self._rehash()
        cdef slot *s = &self.slots[link]
        memset(s, 0, sizeof(slot))
        s.session = 1
        s.acks = acks
        s.idlen = <uint8_t>n
        memcpy(s.ident, PyBytes_AS_STRING(ident), n)
        cdef uint32_t mask = self.tcap - 1
        cdef uint32_t i = _hash(s.ident, s.idlen) & mask
        while self.table[i] != 0 and self.table[i] != UINT32_MAX:
            i = (i + 1) & mask
        if self.table[i] == 0:
            self.tused += 1
        self.table[i] = link + 1
        self.confirm(link, seq)

    def answer_leases(self, bytes instance not None, double lease_s) -> None:
        """Answer sessions' PINGs here from now on, as broker ``instance``:
        PONG ``[token, instance]``, and to a lease ping ``[token, instance,
        lease µs]``, granting ``lease_s`` seconds (0: leave lease pings to
        Python, as a broker with an upstream does, whose lease depends on
        its own from upstream)."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(instance)
        if n > INSTANCE_MAX:
            raise ValueError(f"an instance id has at most {INSTANCE_MAX} bytes")
        if lease_s < 0 or lease_s > 3600:
            raise ValueError("a lease is 0 to 3600 seconds")
        memcpy(self._instance, PyBytes_AS_STRING(instance), n)
        self._instlen = n
        self._lease_ns = <uint64_t>(lease_s * 1e9)

    def grant(self, uint32_t link, uint64_t lease_us) -> None:
        """Python granted the session a lease of ``lease_us`` from now
        (WELCOME, or a PONG it answered): recorded beside the relay's own
        grants, so that the session's lease has one home (``lease_end``).
        The peer keeps the latest end it was granted, so this never
        shortens it."""
        cdef uint64_t end
        if link < self.nslots and self.slots[link].session:
            end = fb_now_ns() + lease_us * 1000u
            if end > self.slots[link].lease_end_ns:
                self.slots[link].lease_end_ns = end

    def lease_end(self, uint32_t link) -> float:
        """When the last lease granted to the session ends (by the relay
        or through ``grant``), in time.monotonic() seconds (-inf: none)."""
        if link < self.nslots and self.slots[link].session and self.slots[link].lease_end_ns:
            return self.slots[link].lease_end_ns / 1e9
        return float("-inf")

    def set_upstream(self, uint32_t link, sock not None) -> None:
        """The upstream broker's link and its DEALER socket (of this
        broker's context): the relay sends it its batches as ``[PUB,
        batch]``, as it does sessions theirs, while the router does not
        hold it (Python queues for it) and its sends succeed.  While
        wait() watches that socket (among ``others``), it also reads it:
        ``[DATA, seq, batch]`` is routed here, and the first other message
        is kept for Python, which takes it with ``take_upstream()`` before
        reading the socket itself."""
        if link >= UINT32_MAX - 1:
            raise ValueError("link id out of range")
        self._grow_slots(link)
        self._uplink = link
        self._uppysock = sock
        self._upsock = <void *><uintptr_t>sock.underlying

    def remove_link(self, uint32_t link) -> None:
        """The link left: its slot (session, lease, traffic) is cleared for
        the next link given its id."""
        cdef int i
        if link == self._uplink:
            for i in range(self._nup):
                Z.msg_close(&self._up[i])
            self._nup = 0
            self._uplink = UINT32_MAX
            self._upsock = NULL
            self._uppysock = None
        if link < self.nslots:
            if self.slots[link].session:
                self._unlink(link)
            memset(&self.slots[link], 0, sizeof(slot))

    def count_in(self, uint32_t link, uint64_t records, uint64_t nbytes) -> None:
        """Python routed a batch from the link (a batch from upstream it
        read itself, a plain PUB socket's message): counted with the
        relay's."""
        self._count(link, False, records, nbytes)

    def count_out(self, uint32_t link, uint64_t records, uint64_t nbytes) -> None:
        """Python sent the link a data batch (one it queued, or to a link
        the relay does not send to): counted with the relay's."""
        self._count(link, True, records, nbytes)

    cdef int _count(self, uint32_t link, bint out, uint64_t records, uint64_t nbytes) except -1:
        if link >= UINT32_MAX - 1:
            raise ValueError("link id out of range")
        self._grow_slots(link)
        cdef slot *s = &self.slots[link]
        if out:
            self.batches_out += 1
            self.messages_out += records
            self.bytes_out += nbytes
            s.batches_out += 1
            s.messages_out += records
            s.bytes_out += nbytes
        else:
            self.batches_in += 1
            self.messages_in += records
            self.bytes_in += nbytes
            s.batches_in += 1
            s.messages_in += records
            s.bytes_in += nbytes
        return 0

    def confirm(self, uint32_t link, uint64_t seq) -> None:
        """The seq that the link's DATA frames carry from now on."""
        cdef int i
        if link < self.nslots:
            for i in range(8):
                self.slots[link].seq[i] = <uint8_t>(seq >> (8 * i))

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
        list, once batches wait for Python to send (``flush()``), when
        ``timeout_ms`` has passed, on a signal, and with ``once`` after
        the first turn that routed anything (for a loop that has per-turn
        work: blocked links, a flow pause).  A terminated context raises
        zmq.ContextTerminated, as pyzmq's poll does."""
        cdef fbz_pollitem items[MAX_WAITED + 1]
        cdef int n = len(others), i, found
        cdef uint64_t deadline
        if n > MAX_WAITED:
            raise ValueError(f"wait() watches at most {MAX_WAITED} sockets and descriptors besides the ROUTER")
        if self._slow is not None:
            return [-1]
        self._upidx = 0
        items[0].socket = self.sock
        items[0].fd = 0
        items[0].events = POLLIN
        items[0].revents = 0
        for i in range(n):
            o = others[i]
            if isinstance(o, int):
                items[i + 1].socket = NULL
                items[i + 1].fd = o
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

    cdef int _run(self, fbz_pollitem *items, int n, uint64_t deadline, bint once) noexcept nogil:
        """wait()'s loop (see there): poll, read and route what the ROUTER
        has, send what is due, until something is Python's."""
        cdef uint64_t now, due
        cdef long ms
        cdef int rc, i, got, found
        while True:
            now = fb_now_ns()
            _lock(&self.router._lock)
            due = fb_router_deadline(self.router._r)          # a lingering batch (0: none)
            fb_lock_release(&self.router._lock)
            if due > deadline:
                due = deadline
            ms = 0 if due <= now else <long>((due - now + 999999u) // 1000000u)
            rc = Z.poll(items, n, ms)
            if rc < 0:
                self._errno = Z.last_error()
                return FOUND_ERROR
            found = 0
            got = 0
            for i in range(1, n):
                if items[i].revents & POLLIN:
                    if i == self._upidx:
                        # Upstream's DATA is routed here; Python is woken
                        # only for a message of its own.
                        got += self._read_up(self.budget)
                        if self._nup:
                            found = FOUND_OTHERS
                    else:
                        found = FOUND_OTHERS
            if items[0].revents & POLLIN:
                got += self._read(self.budget, &found)
            self._send_due(fb_now_ns())
            if self._npend:
                found |= FOUND_LEFTOVERS
            if found:
                return found
            if once and got:
                return FOUND_ACTIVITY
            if fb_now_ns() >= deadline:
                return 0

    cdef int _read(self, int budget, int *found) noexcept nogil:
        """Read and route up to ``budget`` messages until one is Python's
        (kept in self._parts: FOUND_MESSAGE) or the batches left for
        Python reach leftover_limit; the number read."""
        cdef int got = 0, n, i
        while got < budget and self._pend_bytes < self.leftover_limit:
            n = self._recv(self._parts)
            if n == 0:
                break
            got += 1
            if self._route(self._parts, n):
                for i in range(n):
                    Z.msg_close(&self._parts[i])
                continue
            self._nparts = n
            found[0] |= FOUND_MESSAGE
            break
        return got

    cdef bint _route(self, fbz_msg *parts, int n) noexcept nogil:
        """A known session's PUB: route it here (an outbox it fills goes
        at once) and return True.  False for a message Python must see:
        any other, and a PUB the router refused (rc < 0) or took only in
        part (records over the size limits): self._rc and self._over say
        which."""
        cdef uint8_t *cmd
        cdef uint32_t link
        cdef int rc
        cdef uint64_t over
        self._rc = 0
        self._over = 0
        if (n == 3 or n == 4) and Z.msg_size(&parts[1]) == 1 and (<uint8_t *>Z.msg_data(&parts[1]))[0] == b'p':
            return self._ping(parts, n)
        if n != 3 or Z.msg_size(&parts[1]) != 1:
            return False
        cmd = <uint8_t *>Z.msg_data(&parts[1])
        if cmd[0] != b'P':
            return False
        link = self._find(<const uint8_t *>Z.msg_data(&parts[0]), Z.msg_size(&parts[0]))
        if link == UINT32_MAX:
            return False
        rc = self._route_batch(link, Z.msg_data(&parts[2]), Z.msg_size(&parts[2]), &over)
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
        cdef fb_router_stats st
        _lock(&self.router._lock)
        _lock(&self.router._trie._lock)
        fb_router_get_stats(self.router._r, &st)
        over = st.oversize
        rc = fb_router_route(self.router._r, self.router._trie._t, <const void *>data, len, &self.router._lim,
                             link, fb_now_ns())
        if rc >= 0:
            nfull = fb_router_full(self.router._r, self._links, LINKS_PER_CALL)
            fb_router_get_stats(self.router._r, &st)
            over = st.oversize - over
        fb_lock_release(&self.router._trie._lock)
        fb_lock_release(&self.router._lock)
        if rc >= 0:
            self.batches_in += 1
            self.messages_in += <uint64_t>rc
            self.bytes_in += len
            self.slots[link].batches_in += 1
            self.slots[link].messages_in += <uint64_t>rc
            self.slots[link].bytes_in += len
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
        while got < budget and not self._nup and self._pend_bytes < self.leftover_limit:
            n = self._recv_on(self._upsock, self._up)
            if n == 0:
                break
            got += 1
            if n == 3 and Z.msg_size(&self._up[0]) == 1 and (<uint8_t *>Z.msg_data(&self._up[0]))[0] == b'D':
                rc = self._route_batch(self._uplink, Z.msg_data(&self._up[2]), Z.msg_size(&self._up[2]), &over)
                if rc >= 0:
                    for i in range(n):
                        Z.msg_close(&self._up[i])
                    continue
                self._uprc = rc
            else:
                self._uprc = 0
            self._nup = n
        return got

    def take_upstream(self) -> list | None:
        """The message from upstream that wait() kept for Python (its
        frames, bytes), or None.  A DATA the router refused comes as
        ``[b"D", seq, status]``, the status < 0 (a core status code)."""
        cdef int i, n = self._nup
        if not n:
            return None
        frames = [PyBytes_FromStringAndSize(<char *>Z.msg_data(&self._up[i]), Z.msg_size(&self._up[i]))
                  for i in range(n)]
        if self._uprc < 0:
            frames[2] = self._uprc
        for i in range(n):
            Z.msg_close(&self._up[i])
        self._nup = 0
        self._uprc = 0
        return frames

    cdef bint _ping(self, fbz_msg *parts, int n) noexcept nogil:
        """A known session's PING: ``[ident, PING, token]`` (liveness, or a
        flush's marker: every client sends one a ``ping_interval``) or,
        from a session that acknowledges, a lease ping ``[ident, PING,
        token, LEASE_ASK]`` (each filtering publisher, ten to twenty a
        second).  Answer ``[PONG, token, instance]`` here, with the lease's
        µs for a lease ping (the grant recorded, as Python would:
        fastbus.broker.sessions), and return True.  The PONG goes behind
        the DATA routed to the session before the PING (its outbox is sent
        first), as Python's would.  False (Python answers) where it must
        wait behind what Python queues for the link (it is held, or a
        send to it failed this turn), for an unknown peer, a lease ping
        from a peer without "ack" or before Python said the lease, and
        when the socket refuses the PONG."""
        cdef uint32_t link
        cdef int held
        cdef uint64_t now
        cdef uint8_t lease[8]
        cdef uint64_t us = self._lease_ns // 1000u
        cdef int i
        cdef bint lease_ping = n == 4
        if not self._instlen:
            return False                       # Python has not said the instance yet
        if lease_ping and (not self._lease_ns or Z.msg_size(&parts[3]) != 5 or
                           memcmp(Z.msg_data(&parts[3]), b"lease", 5) != 0):
            return False
        link = self._find(<const uint8_t *>Z.msg_data(&parts[0]), Z.msg_size(&parts[0]))
        if link == UINT32_MAX or (lease_ping and not self.slots[link].acks) or self.slots[link].deferred:
            return False
        _lock(&self.router._lock)
        held = fb_router_held(self.router._r, link)
        fb_lock_release(&self.router._lock)
        if held:
            return False
        # What was routed to it before this PING goes first.
        self._send_links(&link, 1, fb_now_ns())
        if self.slots[link].deferred:
            return False                       # that batch is Python's now: so is the PONG behind it
        # The lease counts from before the PONG leaves (the client counts
        # from before its PING left: both ends err short).
        now = fb_now_ns()
        if Z.send(self.sock, self.slots[link].ident, self.slots[link].idlen, DONTWAIT | SNDMORE) < 0:
            return False                       # a full pipe, a peer gone: Python's
        Z.send(self.sock, b"q", 1, DONTWAIT | SNDMORE)
        Z.send(self.sock, Z.msg_data(&parts[2]), Z.msg_size(&parts[2]), DONTWAIT | SNDMORE)
        self.pings_answered += 1
        if not lease_ping:
            Z.send(self.sock, self._instance, self._instlen, DONTWAIT)
            return True
        for i in range(8):
            lease[i] = <uint8_t>(us >> (8 * i))
        Z.send(self.sock, self._instance, self._instlen, DONTWAIT | SNDMORE)
        Z.send(self.sock, lease, 8, DONTWAIT)
        if now + self._lease_ns > self.slots[link].lease_end_ns:
            self.slots[link].lease_end_ns = now + self._lease_ns
        self.leases_granted += 1
        return True

    cdef tuple _take_parts(self):
        """The message _read kept for Python, as ``(frames, meta)``
        (see receive); its parts are closed."""
        cdef int i, n = self._nparts
        meta = None
        if self._rc < 0 or self._over:
            frames = [PyBytes_FromStringAndSize(<char *>Z.msg_data(&self._parts[0]), Z.msg_size(&self._parts[0])),
                      b"P", self._rc if self._rc < 0 else <long>self._over]
        else:
            frames = [PyBytes_FromStringAndSize(<char *>Z.msg_data(&self._parts[i]), Z.msg_size(&self._parts[i]))
                      for i in range(n)]
            if n >= 2 and frames[1] == b"H":
                meta = {"Peer-Address": _prop(&self._parts[1], b"Peer-Address"),
                        "User-Id": _prop(&self._parts[1], b"User-Id")}
        for i in range(n):
            Z.msg_close(&self._parts[i])
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
        ``[ident, b"P", n]``: n < 0, the router refused the batch (a core
        status code); n > 0, it routed the batch but n records over the
        size limits (the other records went).  ``meta`` is, for a HELLO,
        the connection's ``{"Peer-Address": ..., "User-Id": ...}``
        (ZeroMQ's message properties; None where unknown), else None.

        Batches the relay cannot send (held links: slow subscribers) wait
        for ``flush()`` at the end of the turn.  Each read batch can add one
        per matching link, so a turn of RECV_BUDGET batches fanned out to
        many slow subscribers would hold hundreds of MB before Python sees
        them: reading stops at ``leftover_limit`` bytes (the socket stays
        readable; the next turn goes on), and what the broker holds for
        slow subscribers stays their queues' limit."""
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

    cdef int _recv(self, fbz_msg *parts) noexcept nogil:
        """Read one message from the ROUTER socket (see _recv_on)."""
        return self._recv_on(self.sock, parts)

    cdef int _recv_on(self, void *sock, fbz_msg *parts) noexcept nogil:
        """Read one message: its frame count (at most MAX_PARTS kept; the
        rest read and dropped), 0 if none is waiting."""
        cdef int n = 0
        cdef fbz_msg extra
        Z.msg_init(&parts[0])
        if Z.msg_recv(&parts[0], sock, DONTWAIT) < 0:
            Z.msg_close(&parts[0])
            return 0
        n = 1
        while Z.msg_more(&parts[n - 1]):
            if n == MAX_PARTS:
                # Too many frames: keep what we have (Python refuses the
                # message) and drop the rest, so the next read starts clean.
                Z.msg_init(&extra)
                while Z.msg_recv(&extra, sock, DONTWAIT) >= 0 and Z.msg_more(&extra):
                    Z.msg_close(&extra)
                    Z.msg_init(&extra)
                Z.msg_close(&extra)
                return n
            Z.msg_init(&parts[n])
            if Z.msg_recv(&parts[n], sock, DONTWAIT) < 0:
                Z.msg_close(&parts[n])
                return n
            n += 1
        return n

    def flush(self) -> list:
        """Send every batch that is due; return ``(link, batch, records)``
        for those Python must send (and those that receive() or wait()
        left), oldest first."""
        cdef size_t k
        cdef pend *p
        cdef Batch b
        with nogil:
            self._send_due(fb_now_ns())
        out = []
        for k in range(self._npend):
            p = &self._pend[k]
            b = Batch.__new__(Batch)
            b._buf = p.buf
            b._len = p.len
            p.buf = NULL
            out.append((p.link, b, p.count))
            if p.link < self.nslots:
                self.slots[p.link].deferred = 0
        self._npend = 0
        self._pend_bytes = 0
        return out

    cdef void _send_due(self, uint64_t now) noexcept nogil:
        cdef size_t n
        while True:
            _lock(&self.router._lock)
            n = fb_router_due(self.router._r, now, self._links, LINKS_PER_CALL)
            fb_lock_release(&self.router._lock)
            if n:
                self._send_links(self._links, n, now)
            if n < LINKS_PER_CALL:
                return

    cdef void _send_links(self, uint32_t *links, size_t n, uint64_t now) noexcept nogil:
        cdef size_t k
        cdef uint32_t link, count
        cdef unsigned char *buf
        cdef size_t len
        cdef int rc, held
        for k in range(n):
            link = links[k]
            buf = NULL
            len = 0
            _lock(&self.router._lock)
            held = fb_router_held(self.router._r, link)
            rc = fb_router_take(self.router._r, link, now, &buf, &len)
            fb_lock_release(&self.router._lock)
            if rc < 0 or buf is NULL:
                continue                      # FB_ENOMEM: the batch stays for the next turn
            count = 0
            fb_batch_header(buf, len, &count, NULL)
            if link < self.nslots and (self.slots[link].session or link == self._uplink) and not held \
                    and not self.slots[link].deferred:
                if link == self._uplink:
                    rc = self._send_pub(self._upsock, buf, len)
                else:
                    rc = self._send_data(&self.slots[link], buf, len)
                if rc == 0:
                    self.batches_out += 1
                    self.messages_out += count
                    self.bytes_out += len
                    self.slots[link].batches_out += 1
                    self.slots[link].messages_out += count
                    self.slots[link].bytes_out += len
                    continue
                # Python sends this one after the turn; a later batch to the
                # link that the relay sent now (its pipe may have room by
                # then) would overtake it.
                self.slots[link].deferred = 1
            # Python's: another kind of link, a blocked one, a failed send.
            self._leave(link, buf, len, count)

    cdef void _leave(self, uint32_t link, unsigned char *buf, size_t len, uint32_t count) noexcept nogil:
        """Keep a batch for Python (flush())."""
        cdef size_t cap
        cdef pend *p
        if self._npend == self._pcap:
            cap = self._pcap * 2 if self._pcap else 64
            p = <pend *>realloc(self._pend, cap * sizeof(pend))
            if p is NULL:
                # No memory even for the list: the batch is lost, counted
                # as the router's drops are (unrouted would be wrong).
                fb_free(buf)
                self.dropped += count
                return
            self._pend = p
            self._pcap = cap
        p = &self._pend[self._npend]
        p.link = link
        p.buf = buf
        p.len = len
        p.count = count
        self._npend += 1
        self._pend_bytes += len

    cdef int _send_data(self, slot *s, unsigned char *buf, size_t len) noexcept nogil:
        """[ident, DATA, seq, batch]: 0 when sent (the batch is then libzmq's
        or freed), else the errno (the batch is still ours).  Only the
        routing id can fail (ROUTER_MANDATORY: EAGAIN for a full pipe,
        EHOSTUNREACH for a peer that left); the other frames follow it."""
        cdef fbz_msg m
        cdef int err
        if Z.send(self.sock, s.ident, s.idlen, DONTWAIT | SNDMORE) < 0:
            err = Z.last_error()
            return err if err != 0 else EAGAIN
        Z.send(self.sock, b"D", 1, DONTWAIT | SNDMORE)
        Z.send(self.sock, s.seq, 8, DONTWAIT | SNDMORE)
        if len <= COPY_MAX:
            Z.send(self.sock, buf, len, DONTWAIT)
            fb_free(buf)
        else:
            Z.msg_init_data(&m, buf, len, _free_batch, NULL)
            if Z.msg_send(&m, self.sock, DONTWAIT) < 0:
                Z.msg_close(&m)               # frees the batch
        return 0

    cdef int _send_pub(self, void *sock, unsigned char *buf, size_t len) noexcept nogil:
        """[PUB, batch] on a DEALER socket (the upstream broker's), as
        _send_data: 0 when sent, else the errno (the batch still ours).
        Only the first frame can fail (EAGAIN: its pipe is full); the
        batch follows it."""
        cdef fbz_msg m
        cdef int err
        if Z.send(sock, b"P", 1, DONTWAIT | SNDMORE) < 0:
            err = Z.last_error()
            return err if err != 0 else EAGAIN
        if len <= COPY_MAX:
            Z.send(sock, buf, len, DONTWAIT)
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
        cdef slot *s
        out = {}
        for i in range(self.nslots):
            s = &self.slots[i]
            if s.session or s.batches_in or s.batches_out:
                out[i] = (s.batches_in, s.messages_in, s.bytes_in, s.batches_out, s.messages_out, s.bytes_out)
        return out
