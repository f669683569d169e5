# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A client's publish path as one call into C: the Publisher, over an
Outbox of fastbus._core (its class docstring says the rest).

Its own module: it holds policy above the core (who sends, when to wait
for room and for how long, the filter's lease) that the core's bindings do
not know.  The client's native engine (fastbus/client/_engine.pyx) cimports
it and takes its sealed batches and its view from C threads; the Redis
publisher (fastbus/redis/publisher.py) uses it over an Outbox in RESP mode.
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from fastbus._core cimport (Batch, Outbox, _append, _as_message, _check, _encode_headers, _lock, _raise, _unlock,
                            _wrap_batch)
from fastbus.includes.fb_batchq cimport *
from fastbus.includes.fb_burst cimport *
from fastbus.includes.fb_common cimport *
from fastbus.includes.fb_outbox cimport *
from fastbus.includes.fb_view cimport *

import threading
import time

from fastbus.errors import BatchError, MessageTooLarge, PublishTimeout

cdef class Publisher:
    """The publish path of a client as one call into C: the publisher-side
    filter (the broker's view of what subscribers want, built from its WANT
    messages by ``apply_want`` or by a native reader, csrc/fb_view.h; no
    view: everything is sent), the append to
    ``outbox``, and the decision who sends the batch, and when.

    **Who sends.**  Without ``send_now``, a sender thread of the owner's
    does: ``wake()`` is called when a batch starts and when it fills, and
    the sender ``take()``s what is there.  With ``send_now``, the publishing
    thread itself may send (a hop less): ``send_now(full)`` is called when
    the batch fills (``full`` True), and when a batch starts on a publisher
    that is idle.  Idle means: nothing was sent for ``burst_gap`` seconds,
    or fewer than ``burst_limit`` batches were sent since, each within
    ``burst_gap`` of the one before.  A publisher called back to back (a
    burst) is not idle: its batch starts with ``wake()`` instead, and the
    sender thread sends what gathered by the time it runs.  The owner tells
    the publisher of every send with ``sent(full)``: a full batch, or one the
    sender thread sent, marks the publisher busy until ``burst_gap`` passes.
    (The rule is csrc/fb_burst.h's, whose state the native sender shares.)
    So at a low rate every message leaves in the publishing thread at once;
    under load batches form by themselves, and nothing waits for a timer.

    Batches stay bounded when the sender falls behind: a full batch the
    sender has not taken yet is sealed (kept aside as it is) and the next
    record starts a new one, so a batch never grows past the outbox's
    ``max_messages``/``max_bytes`` by more than one record.  The sender
    takes sealed batches first, oldest first, with ``take()``; one it could
    not send goes back first with ``put_back()``.  When the sealed batches
    and the outbox together hold ``max_buffer_bytes`` (0: no limit),
    ``publish`` waits for the sender to take some, at most
    ``block_timeout`` seconds (None: no limit), then raises PublishTimeout
    (its message says ``block_reason()`` if set) without queuing the
    message.  A closed publisher raises ``closed_error(closed_message)``.
    ``max_topic``/``max_payload`` (0: none; a client sets the broker's)
    refuse a message over them with MessageTooLarge (a ValueError), before
    it is queued; ``max_payload`` counts headers too.  A message with
    headers is refused (ValueError) by an outbox in RESP mode, and with
    ``headers_refused`` as its message when that is set (a broker that
    takes none).

    **The filter's lease.**  The view drops a message only until
    ``lease_until_ns`` (monotonic ns; default: for ever): a broker lets its
    publishers filter with its view for a bounded time from their last
    answered ping, and confirms a subscription once that time has passed
    for every publisher that did not acknowledge it (docs/PROTOCOL.md).
    Past it, a message the filter would drop is sent (counted in
    ``lapsed``).  Either way, when the lease has run out or reaches its
    renewal time, ``renew()`` (if set) is called once, until ``lease()``
    answers (or ``renewal_answered()``): it has a lease ping sent, a native
    sender's ``wake`` when there is one (csrc/fb_view.h).  The lease
    itself lives in the view, where a native reader applies its PONG."""

    def __cinit__(self, Outbox outbox not None, wake not None, *, send_now=None, double burst_gap=20e-6,
                  int burst_limit=4, Py_ssize_t max_buffer_bytes=0, block_timeout=None, block_reason=None,
                  closed_error=RuntimeError, str closed_message="client is closed"):
        if not (burst_gap >= 0.0) or burst_gap > 60.0:
            raise ValueError(f"burst_gap must be between 0 and 60 seconds, not {burst_gap!r}")
        if burst_limit < 0:
            raise ValueError(f"burst_limit must be >= 0, not {burst_limit}")
        if max_buffer_bytes < 0:
            raise ValueError(f"max_buffer_bytes must be >= 0 (0: no limit), not {max_buffer_bytes}")
        if block_timeout is not None and not block_timeout >= 0:
            raise ValueError(f"block_timeout must be >= 0 seconds, or None to wait for ever, not {block_timeout!r}")
        self.outbox = outbox
        fb_view_init(&self._view)
        self.wake = wake
        self.send_now = send_now
        self.closed = False
        self.closed_error = closed_error
        self.closed_message = closed_message
        self.pending_error = None
        self.max_buffer_bytes = max_buffer_bytes
        self.block_timeout = block_timeout
        self.block_reason = block_reason
        self._room = None
        self._waiting = 0
        fb_batchq_init(&self._sealed)
        fb_burst_init(&self._burst, <uint64_t>(burst_gap * 1e9), burst_limit)
        self.max_topic = 0
        self.max_payload = 0
        self.headers_refused = None
        self.renew = None

    def __dealloc__(self):
        fb_batchq_clear(&self._sealed)
        fb_view_free(&self._view)

    def publish(self, channel, message, headers=None) -> int:
        """Queue a message; 0 if no subscriber wants its channel."""
        return self._publish(channel, message, headers)

    cdef int _publish(self, object channel, object message, object headers) except -1:
        return self._publish_block(channel, message, None if headers is None else _encode_headers(headers))

    def publish_request(self, channel, message, bytes reply_to not None, headers=None, hold=None) -> int:
        """publish() of a request: its headers say ``reply_to`` (the
        protocol's :reply-to, first) besides the caller's ``headers``;
        ``hold`` (an int, 0 to 2**32 - 1), a request to a held group that
        keeps at most that many (0: no count bound; the :hold header)."""
        cdef bytes h = None
        if hold is not None:
            if not 0 <= hold <= 0xFFFFFFFF:
                raise ValueError(f"a held group's capacity is 0 to {0xFFFFFFFF}, not {hold}")
            h = str(int(hold)).encode()
        return self._publish_block(channel, message, _encode_headers(headers, reply_to, h))

    cdef int _publish_block(self, object channel, object message, bytes h) except -1:
        """publish() with the headers already a block (None: none)."""
        if self.closed:
            raise self.closed_error(self.closed_message)
        if self.pending_error is not None:
            # An earlier failure, reported once, by the next call; this
            # call's message is not queued.
            err, self.pending_error = self.pending_error, None
            raise err
        cdef bytes t = _as_message(channel)
        cdef bytes p = _as_message(message)
        cdef Outbox ob = self.outbox
        if h is not None:
            if ob._o.resp_len:
                raise ValueError("headers cannot go to Redis: its PUBLISH carries none (a fastbus broker's "
                                 "clients take them)")
            if self.headers_refused is not None:
                raise ValueError(self.headers_refused)
        self._check_limits(t, p, h)
        cdef int took = FB_OK
        cdef bint starts
        cdef unsigned char *sealed = NULL
        cdef size_t sealed_len = 0, sealed_count = 0
        cdef uint64_t now, until
        if fb_view_match_lease(&self._view, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t), &until) == 0:
            # Nobody wants it, as far as the view goes, and the view
            # counts only under its lease (the time is read only here,
            # never for a message someone wants).  The lease is the one
            # read with that view, and the clock is read after both: a
            # lease applied later (renew() below may read its PONG, or a
            # native reader may apply it meanwhile) came behind WANTs this
            # view lacks, and a lease of a ping sent after the clock was
            # read (a downstream broker's 0 for one) says nothing about it.
            now = fb_now_ns()
            if self.renew is not None and fb_view_ask_renewal(&self._view, now, 0):
                self.renew()
            if now < until:
                self._refused += 1
                return 0
            self._lapsed += 1
        if self.max_buffer_bytes and \
                <Py_ssize_t>(self._sealed.bytes + fb_outbox_bytes(&ob._o)) >= self.max_buffer_bytes:
            self.wait_for_room()
        _lock(&ob._lock)
        if fb_outbox_full(&ob._o):
            # The sender has not taken this full batch yet: seal it
            # (under the outbox's lock, as a native sender takes it).
            sealed_count = fb_outbox_count(&ob._o)
            took = fb_outbox_take(&ob._o, &sealed, &sealed_len)
            if sealed is not NULL and fb_batchq_push(&self._sealed, sealed, sealed_len,
                                                     <uint32_t>sealed_count) < 0:
                # No memory for the queue's entry: the batch stays in the
                # outbox (which grows past its limit) rather than be lost.
                fb_outbox_untake(&ob._o, sealed, sealed_len, <uint32_t>sealed_count)
        starts = fb_outbox_count(&ob._o) == 0
        # The outbox uses the time only for the first record of a batch.
        rc = _append(&ob._o, t, h, p, fb_now_ns() if starts else 0)
        if rc >= 0:
            self._accepted += 1
        _unlock(&ob._lock)
        if took < 0:
            _raise(took, "publish")
        if rc < 0:
            _raise(rc, "publish")
        # Not a wake (a pipe write) for every record: that tripled the cost
        # of publish under load.  Once when the batch starts, once when full.
        if rc == 1:
            if self.send_now is not None:
                self.send_now(True)
            else:
                self.wake()
        elif starts and sealed is NULL:
            self._started()
        return 1

    cdef int _check_limits(self, bytes t, bytes p, bytes h) except -1:
        cdef Py_ssize_t hl = 0 if h is None else PyBytes_GET_SIZE(h)
        if self.max_payload and PyBytes_GET_SIZE(p) + hl > self.max_payload:
            if hl:
                raise MessageTooLarge(f"a payload of {PyBytes_GET_SIZE(p):,} bytes with {hl:,} bytes of headers is "
                                      f"over the broker's limit of {self.max_payload:,} (max_payload, which counts "
                                      f"both); not sent", "payload", PyBytes_GET_SIZE(p) + hl, self.max_payload)
            raise MessageTooLarge(f"a payload of {PyBytes_GET_SIZE(p):,} bytes is over the broker's limit of "
                                  f"{self.max_payload:,} (max_payload); not sent",
                                  "payload", PyBytes_GET_SIZE(p), self.max_payload)
        if self.max_topic and PyBytes_GET_SIZE(t) > self.max_topic:
            raise MessageTooLarge(f"a channel name of {PyBytes_GET_SIZE(t):,} bytes is over the broker's limit of "
                                  f"{self.max_topic:,} (max_topic); not sent",
                                  "channel name", PyBytes_GET_SIZE(t), self.max_topic)
        return 0

    def check_many(self, messages) -> list:
        """``messages`` (``(channel, message)`` pairs, or ``(channel,
        message, headers)``) as a list of ``(channel, message, headers)``
        (bytes; headers a mapping or None), each checked as publish()
        checks it (its types, the broker's limits): the first bad one
        raises, before anything is queued."""
        return [(t, p, headers) for t, p, headers, _block in self._checked(messages)]

    cdef list _checked(self, messages):
        """check_many's items, each with its header block too (encoded
        once: publish_many queues it as it is)."""
        cdef list out = []
        cdef bytes t, p, block
        for item in messages:
            headers = None
            try:
                if len(item) == 3:
                    channel, message, headers = item
                else:
                    channel, message = item
            except (TypeError, ValueError):
                raise TypeError(f"publish_many takes (channel, message) pairs or (channel, message, headers), "
                                f"not {item!r:.80}") from None
            t = _as_message(channel)
            p = _as_message(message)
            block = None if headers is None else _encode_headers(headers)
            self._check_limits(t, p, block)
            out.append((t, p, headers, block))
        return out

    def publish_many(self, messages) -> int:
        """Queue many ``(channel, message)`` pairs (or ``(channel,
        message, headers)``), all checked first (``check_many``: a bad one
        raises and none is queued); returns how many were queued (the
        others nobody wanted)."""
        cdef list items = self._checked(messages)
        cdef Py_ssize_t n = 0
        for t, p, _headers, block in items:
            n += self._publish_block(t, p, block)
        return n

    cdef int _started(self) except -1:
        """A batch started: send it now if the publisher is idle, else
        leave it to the sender thread (it gathers what comes meanwhile)."""
        if self.send_now is None:
            self.wake()
            return 0
        if fb_burst_starts_idle(&self._burst, fb_now_ns()):
            self.send_now(False)
        else:
            self.wake()
        return 0

    def sent(self, bint full=False) -> None:
        """The owner sent a batch of this publisher's (``full``: a full one,
        or one its sender thread sent: the publisher is busy)."""
        fb_burst_sent(&self._burst, full, fb_now_ns())

    @property
    def idle(self) -> bool:
        """Would a batch starting now be sent at once (see the class doc)?"""
        return fb_burst_idle(&self._burst, fb_now_ns()) != 0

    @property
    def accepted(self) -> int:
        """Messages publish() queued."""
        return self._accepted

    @property
    def lapsed(self) -> int:
        """Messages the filter would have dropped, sent because its lease
        had run out (see the class doc)."""
        return self._lapsed

    # -- the view (csrc/fb_view.h) -------------------------------------------

    def apply_want(self, int flags, ops, seq=None) -> int:
        """Apply a WANT's flags and ops batch (and its seq, if it has one):
        the seq to acknowledge now (0: none; once sent, ``acked(seq)``).
        BatchError (a ValueError) if the ops are malformed: the view is
        then unchanged."""
        cdef Py_buffer view
        cdef uint64_t ack = 0
        cdef int rc
        cdef bint has_seq = seq is not None
        cdef uint64_t s = seq if has_seq else 0
        PyObject_GetBuffer(ops, &view, PyBUF_SIMPLE)
        try:
            # With the interpreter lock held: the caller holds its
            # connection's lock, and letting go of the interpreter here
            # could leave it waiting a switch interval to come back while
            # the native sender waits for the connection.  (The view's lock
            # is held only for one call, by threads that never take the
            # interpreter's.)
            rc = fb_view_apply(&self._view, <unsigned>flags, view.buf, <size_t>view.len, has_seq, s,
                               fb_now_ns(), &ack)
        finally:
            PyBuffer_Release(&view)
        _check(rc, "WANT ops")
        return ack

    def acked(self, uint64_t seq) -> None:
        """An ACK for ``seq`` was sent."""
        fb_view_acked(&self._view, seq)

    def grant(self, uint64_t ack_until_ns) -> int:
        """A lease arrived that the broker counts until ``ack_until_ns``
        (monotonic ns): WANTs applied until then are acknowledged at once.
        Returns the seq to acknowledge now (applied outside the last
        lease), or 0."""
        return fb_view_grant(&self._view, ack_until_ns)

    def forget_view(self) -> None:
        """A new session: no view (everything is sent) until its first
        WANT reset; its WANTs are numbered anew."""
        fb_view_forget(&self._view)

    @property
    def has_view(self) -> bool:
        """Has a WANT reset arrived this session (a view to filter with)?"""
        return self._view.on != 0

    @property
    def wants_applied(self) -> int:
        """WANT messages applied to the view, by any thread."""
        return self._view.wants

    def view_matches(self, channel) -> bool | None:
        """Does the view want this channel (None: there is no view)?"""
        cdef bytes t = _as_message(channel)
        cdef int rc = fb_view_match(&self._view, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t))
        return None if rc < 0 else rc == 1

    def filters(self) -> bool:
        """Does the view drop what it does not match now (a view, under a
        lease that has not run out)?"""
        return self._view.on and fb_view_in_lease(&self._view, fb_now_ns())

    # -- the lease (csrc/fb_view.h) --------------------------------------------

    def lease(self, uint64_t sent_ns, uint64_t lease_us) -> int:
        """The broker granted ``lease_us`` for what left at ``sent_ns`` (a
        lease ping, or HELLO): the view counts until then plus
        ``LEASE_USE`` of it (never less than before), the renewal asked
        for is answered, and the seq to acknowledge now (applied outside
        the last lease) is returned, or 0."""
        return fb_view_lease(&self._view, sent_ns, lease_us)

    def renewal_answered(self) -> None:
        """A lease ping was answered without a lease: ask again when due."""
        fb_view_renewal_answered(&self._view)

    def ask_renewal(self) -> bool:
        """Ask for a renewal now (``renew()``), unless one is asked for
        already: the filter is in use, its lease has run out."""
        if self.renew is not None and fb_view_ask_renewal(&self._view, 0, 1):
            self.renew()
            return True
        return False

    def set_lease(self, uint64_t until_ns) -> None:
        """Set the lease outright: 0 (none: what the view would drop is
        sent), or 2**64-1 (for ever: a broker that grants no lease waits
        for no publisher, and the view counts as it is)."""
        fb_view_set_lease(&self._view, until_ns)

    @property
    def lease_until_ns(self) -> int:
        """Until when the view counts (monotonic ns; 2**64-1: for ever)."""
        return self._view.lease_until_ns

    @property
    def renewal_pending(self) -> bool:
        """Is a renewal asked for and not answered yet?"""
        return self._view.renew != FB_VIEW_RENEW_NONE

    @property
    def leases(self) -> int:
        """Leases applied, by any thread."""
        return self._view.leases

    @property
    def refused(self) -> int:
        """Messages publish() did not queue because nobody wanted their
        channel (it returned 0)."""
        return self._refused

    def linger_left(self, uint64_t linger_ns) -> float:
        """Seconds until a partial batch may leave under a linger of
        ``linger_ns`` after the last send (0.0: now); the native sender's
        rule (csrc/fb_burst.h fb_burst_linger_due)."""
        cdef uint64_t now = fb_now_ns()
        cdef uint64_t due = fb_burst_linger_due(&self._burst, linger_ns, now)
        return (due - now) / 1e9 if due else 0.0

    def take(self, bint force=False):
        """For the sender: ``(batch, records)`` of the oldest sealed batch,
        else of the outbox's batch if it is due (or ``force``), else None."""
        cdef Outbox ob = self.outbox
        cdef unsigned char *buf = NULL
        cdef size_t n = 0, count = 0
        cdef uint32_t sealed_count = 0
        cdef int rc = FB_OK
        _lock(&ob._lock)
        if fb_batchq_pop(&self._sealed, &buf, &n, &sealed_count):
            count = sealed_count
        elif fb_outbox_count(&ob._o) and (force or fb_outbox_due(&ob._o, fb_now_ns())):
            count = fb_outbox_count(&ob._o)
            rc = fb_outbox_take(&ob._o, &buf, &n)
        _unlock(&ob._lock)
        _check(rc, "take")
        if buf is NULL:
            return None
        item = (_wrap_batch(buf, n), count)
        if self._waiting:
            with self._room:
                self._room.notify_all()
        return item

    def put_back(self, Batch batch not None, Py_ssize_t count) -> None:
        """A batch from take() that could not be sent: it is sent first next
        time, and counts in the buffer again."""
        cdef Outbox ob = self.outbox
        cdef unsigned char *buf = <unsigned char *>malloc(batch._len if batch._len else 1)
        if buf is NULL:
            raise MemoryError()
        memcpy(buf, batch._buf, batch._len)
        _lock(&ob._lock)
        cdef int rc = fb_batchq_push_front(&self._sealed, buf, batch._len, <uint32_t>count)
        _unlock(&ob._lock)
        if rc < 0:
            free(buf)
            raise MemoryError()

    def wait_for_room(self) -> None:
        """Block until the buffer is below max_buffer_bytes (publish() calls
        this): PublishTimeout after block_timeout seconds, closed_error if
        the publisher closes.  An asyncio twin waits its own way with
        ``room_check()``."""
        if self._room is None:
            self._room = threading.Condition()
        deadline = self.room_deadline
        with self._room:
            self._waiting += 1
            try:
                while not self.room_check(deadline):
                    left = None if deadline is None else deadline - time.monotonic()
                    # A native sender frees room without notifying: look
                    # again soon (only ever a full buffer waits here).
                    self._room.wait(0.01 if left is None else max(0.0, min(left, 0.01)))
            finally:
                self._waiting -= 1

    @property
    def room_deadline(self):
        """When a wait for room that starts now gives up (time.monotonic();
        None: never, block_timeout None)."""
        return None if self.block_timeout is None else time.monotonic() + self.block_timeout

    def room_check(self, deadline) -> bool:
        """One step of waiting for room: True if publish() can queue now;
        else closed_error if closed, PublishTimeout once ``deadline``
        (``room_deadline`` when the wait began) has passed, or False after
        waking the sender (the caller waits, and looks again)."""
        if self.has_room():
            return True
        if self.closed:
            raise self.closed_error(self.closed_message)
        if deadline is not None and time.monotonic() >= deadline:
            why = self.block_reason() if self.block_reason is not None else "the sender is behind"
            raise PublishTimeout(f"publish: {self.buffered_bytes} bytes waiting to be sent for "
                                 f"{self.block_timeout} s: {why}")
        self.wake()
        return False

    def has_room(self) -> bool:
        """Would publish() queue without waiting for room?"""
        return not self.max_buffer_bytes or self.buffered_bytes < self.max_buffer_bytes

    @property
    def buffered_bytes(self) -> int:
        """Bytes queued: sealed batches and the outbox's batch."""
        return <Py_ssize_t>(self._sealed.bytes + fb_outbox_bytes(&self.outbox._o))

    @property
    def queued(self) -> int:
        """Messages queued, not yet taken by the sender."""
        return <Py_ssize_t>(self._sealed.count + fb_outbox_count(&self.outbox._o))

    def has_sealed(self) -> bool:
        """Is a full batch waiting for the sender?"""
        return self._sealed.batches != 0


cdef class ClientBase:
    """The part of a client in C that every publish goes through: its
    ``_publisher``, and ``publish``/``publish_many`` as methods of the
    class (fastbus.Client is its subclass, as pyzmq's Socket is of its
    Cython socket).  A method in Python around the publisher's call cost
    more than the call itself (a frame and an attribute lookup per message:
    150-190 ns against 310-330 for the whole publish, measured in a real
    client); here it is one C call to the next."""

    @cython.embedsignature(False)     # (its docstring is its asyncio twin's too)
    def publish(self, channel: ChannelT, message: EncodableT, headers: Mapping[str, str | bytes] | None = None) -> int:
        """Queue a message; returns 1, or 0 when no subscriber wants its
        channel (the broker said so), in which case it is not sent.  The
        broker's word counts only under its filter lease (90% of
        ``--filter-lease``, 0.1 s, renewed while the filter drops
        messages): before its first view, and for a publisher that sends
        less than about one message per lease, publish() sends and says 1
        (the broker drops what nobody wants; ``stats()["unfiltered"]``
        counts it); :meth:`is_wanted` asks for a lease when it has none.
        ``headers``: a mapping of str names to str or bytes values that
        travels with the message (subscribers find it as the message's
        ``"headers"``); with the payload it must fit the broker's
        max_payload.  (One call into C: the publisher's outbox, filter and
        buffer, and the send when the client is idle.)"""
        if self._publisher is None:
            raise RuntimeError("this client was not started")
        return self._publisher._publish(channel, message, headers)

    @cython.embedsignature(False)
    def publish_many(self, messages: Iterable[tuple[ChannelT, EncodableT]]) -> int:
        """Queue many ``(channel, message)`` pairs, or ``(channel, message,
        headers)``; returns how many were queued (the others nobody wanted).  Every pair is checked first: a
        bad one raises (TypeError, ValueError) and none is queued."""
        if self._publisher is None:
            raise RuntimeError("this client was not started")
        return self._publisher.publish_many(messages)
