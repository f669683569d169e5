"""One connection to the broker, used by whichever thread holds its lock.

(This file is over 700 lines because the rules for sharing one connection
between threads (its lock, handing work over, reading, sending, waiting)
must be read and changed together; the two kinds of session are in
``_pubsession.py`` and ``_subsession.py``, the native threads and reactions
in ``_engine.pyx``.)

A client has one session for publishing and one per PubSub.  There is no
thread that owns the sockets: the thread that has work does it.  A thread
publishing sends its message itself when the publisher is idle; a thread in
``get_message()`` reads the socket itself and gets the message in its own
hand, as with a redis-py or pyzmq socket.  While no user thread does, the
session's native threads (``_engine``: a sender, a reader) send batches
that formed during a burst, read what arrives for a PubSub nobody is
reading (up to ``max_inbox_bytes``), answer the broker and ping it; the
client's keeper thread (``_keeper.Keeper``) does what they hand back.  An
asyncio client's event loop takes the keeper's place.

The rules every holder follows:

* Only the holder of ``lock`` touches the socket (a ``SessionLock``: the
  client's native sender, ``_engine.Sender``, holds it too when it sends).
  The lock is taken only through this class (``hold()``, ``attempt()``,
  ``driving()``, ``close_within()``) and let go of by ``release()``.  A thread that finds the
  lock taken hands its work over with ``post()``: the holder runs it before
  it lets go, and a holder blocked in ``wait()`` is woken for it.
* Before letting go (``release()``), the holder reads what the socket has
  for it: a send may have consumed the edge of the socket's notification
  descriptor (ZMQ_FD), and nobody would be woken for that input otherwise.
* Sends never block: a control frame the socket cannot take waits in
  ``outq`` (in order, sent before anything else); a data batch goes back to
  the publisher (``Publisher.put_back``) and counts in its buffer.
"""

from __future__ import annotations

import logging
import math
import os
import select
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import zmq

from fastbus import protocol as P
from fastbus.client import _engine
from fastbus.endpoints import host_name, sockaddr
from fastbus.client._engine import SessionLock

if TYPE_CHECKING:
    from fastbus.client._connections import Connections

log = logging.getLogger("fastbus.client")

POLLIN, POLLOUT = int(zmq.POLLIN), int(zmq.POLLOUT)
_zmq_poll = zmq.zmq_poll

# A Python thread sends and reads holding the connection's lock, without
# letting go of the interpreter lock there: one that let go could wait a
# switch interval to get it back while a native thread waits for the
# connection (issue 22).
send_frames = _engine.send_frames
recv_frames = _engine.recv_frames
_events = _engine.events


READ_BUDGET = 64          # frames read at a time before the holder looks at other work
SEND_BURST = 32           # batches sent before the broker is read again (a FLOW pause then takes effect)
#: Why a session says HELLO again when its broker's instance changed (its
#: PONG said so): a broker that journals may still hold the session.
BROKER_RESTARTED = ("broker restarted: what was published to it before this client subscribed again was not "
                    "delivered")
BYE_WAIT = 0.5            # seconds close() waits for the broker to answer BYE (brokers whose WELCOME says "bye")
OUTQ_BACKSTOP = 0.05      # how soon the keeper looks again at control frames waiting for room


def native_stream(endpoint: str) -> _engine.Stream | None:
    """A connection to ``endpoint`` as a Stream (csrc/fb_zmtp.h: the
    calling thread writes and reads it, no libzmq I/O thread on a
    message's way, and what the peer did not take can go again after a
    cut), not yet connected; None where it cannot be one: to an endpoint
    that is not tcp:// or ipc://, or when
    ``FASTBUS_CLIENT_TRANSPORT=libzmq`` asks for a pyzmq socket.  CURVE
    needs a pyzmq socket: callers with keys do not ask."""
    if os.environ.get("FASTBUS_CLIENT_TRANSPORT", "stream") == "libzmq":
        return None
    address = sockaddr(endpoint)
    return _engine.Stream(address, host_name(endpoint)) if address is not None else None


class Session:
    """A DEALER connection to the broker and its protocol state."""

    kind = ""
    #: Says "ack" in HELLO: acknowledges WANT and filters under the broker's
    #: lease (a publishing session; docs/PROTOCOL.md).
    acks = False
    #: What arrives is the keeper's to take even while nobody reads (a
    #: client's inbox of replies, SubSession), not only control frames.
    wake_on_data = False

    def __init__(self, conns: Connections) -> None:
        self.conns = conns                # its owner: options, context, keeper
        self.options = conns.options
        self._keeper = conns.keeper
        self.lock = SessionLock()         # threading.Lock's interface; a native thread may hold it too
        self.drivers: list[_Driver] = []  # user threads driving it now (a token each): the keeper leaves it alone
        self.loop = None                  # the asyncio loop that drives it, if any...
        self.loop_wake_fd: int | None = None   # ...the descriptor it watches (drive_from)...
        self.loop_input: Callable[[], None] | None = None   # ...and how it learns of input we read
        self.via_reader = False           # the message being handled came through the native reader
        self.posted: deque[Callable[[], None]] = deque()
        self.outq: deque[list] = deque()  # control frames waiting for room in the socket
        self.sock: zmq.Socket | None = None
        self.reactions: _engine.Reactions | None = None   # what C answers at once (open() makes them)
        self.reader = None                # the native reader (_engine.Reader), once started
        self.monitor: zmq.Socket | None = None   # CURVE handshake events (see handshake_failure())
        self._handshake_failure: str | None = None
        self.fd = -1
        self._instance = b""              # the broker's, from WELCOME / PONG (instance)
        self.welcome: dict = {}           # the broker's latest WELCOME
        self.limits: dict = {}            # what the broker's WELCOME said it accepts
        self.resyncing = False            # a new HELLO is on its way (until WELCOME)
        # The session outlives its connection (docs/PROTOCOL.md, "Resuming
        # a session"): its id, named in every HELLO.
        self.session_id = P.new_session_id()
        self._next_ping = 0.0             # (next_ping)
        self.more = False                 # stopped reading before the socket was empty
        self.blocked = False              # a data batch met a full socket (EAGAIN)
        self.unread = False               # sent since input was last read to the end
        self.ready = False                # a poll said the socket has input
        self.keeper_skipped = False       # the keeper found the lock taken (see keeper_may_look)
        self.closing = False              # close() called or under way (close_within)
        self.closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._polled: object = None       # the socket as zmq_poll names it
        self._items: list = []            # what wait() polls: the socket and the wake pipe
        self._items_out: list = []        # the same, and room to send
        # For a Stream (every item a descriptor): the same two as the
        # kernel's poll, which wait() uses instead: one syscall a wait
        # (libzmq's zmq_poll makes a first pass that does not wait).
        self._pollers: tuple | None = None

    # -- opening and closing (the lock held) ----------------------------------

    def open(self) -> None:
        opts = self.options
        _engine.require()
        s = self._stream()
        if s is None:
            s = self.conns.context.socket(zmq.DEALER)
            s.ipv6 = True                 # (a broker may listen on tcp://[::1]:PORT; IPv4 still works)
        s.linger = 2000
        s.rcvhwm = 16                     # batches: back-pressure reaches the broker soon
        self.configure(s)
        s.reconnect_ivl = 100
        s.reconnect_ivl_max = 2000
        # No ZMTP heartbeat timeout: a subscriber that pauses reading (full
        # inbox) must not be cut off as dead.  Broker restarts show in PONGs.
        s.tcp_keepalive = 1
        if opts.curve:
            server, public, secret = opts.curve
            s.curve_serverkey = server.encode()
            s.curve_publickey = public.encode()
            s.curve_secretkey = secret.encode()
            # A broker that refuses this client's key says so only in the
            # handshake (and libzmq then stops reconnecting): watch it.
            self.monitor = s.get_monitor_socket(
                zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
        s.connect(opts.endpoint)
        if not isinstance(s, zmq.Socket):
            # Back on a new connection, it says so at once (the broker
            # answers an unknown connection's PING with KICK "hello
            # required", and the session resumes): not at its next ping.
            s.set_reconnect_message([P.PING, P.RECONNECT_TOKEN])
            # What the broker did not take yet is kept, and goes again on
            # the next connection (what was in flight when one was cut).
            s.set_resend(P.RESENT, opts.max_buffer_bytes)
        self.sock = s
        self.fd = s.FD
        self.reactions = self.make_reactions(s)
        self.reactions.instance = self._instance
        # zmq_poll gives back a pyzmq socket as itself, anything else as
        # its descriptor (a Stream's FD: readable when its events changed).
        self._polled = s if isinstance(s, zmq.Socket) else s.FD
        self._items = [(self._polled, POLLIN), (self._wake_r, POLLIN)]
        self._items_out = [(self._polled, POLLIN | POLLOUT), (self._wake_r, POLLIN)]
        self._pollers = None
        if not isinstance(s, zmq.Socket):
            self._pollers = (select.poll(), select.poll())
            for poller, events in zip(self._pollers, (select.POLLIN, select.POLLIN | select.POLLOUT)):
                poller.register(s.FD, events)
                poller.register(self._wake_r, select.POLLIN)
        self.next_ping = time.monotonic() + opts.ping_interval
        self.hello()
        self.open_native()

    def buffered(self) -> bool:
        """Are whole messages waiting in the connection that a poll of its
        descriptor would not show (a Stream's, read into it but not yet
        received: the native reader stops at a full queue)?  A pyzmq
        socket's poll shows them: False.  No syscall."""
        return self._polled is not self.sock and self.sock is not None and self.sock.buffered()

    def reader_holds(self) -> bool:
        """Did the native reader queue messages that a read would take now?
        It may have read them just before this thread took the lock (the
        owner it woke for them is the keeper, which leaves a driven session
        alone): a wait must not sleep on a socket they already left."""
        r = self.reader
        return r is not None and r.queued > 0 and self.reading()

    def _stream(self) -> _engine.Stream | None:
        """The connection as a Stream where it can be one (native_stream)."""
        return None if self.options.curve else native_stream(self.options.endpoint)

    def configure(self, sock: zmq.Socket) -> None:
        """Socket options of this kind of session."""

    def close(self) -> None:
        """Say goodbye and close the socket (the lock held)."""
        self.closing = self.closed = True
        if self.monitor is not None and self.sock is not None:
            try:
                self.sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self.monitor.close(linger=0)
            self.monitor = None
        if self.sock is not None:
            if self.send(self.bye_frames()) and self.welcome.get("bye") is True:
                self._await_bye(BYE_WAIT)
            self.sock.close(linger=1000)
            self.sock = None
            self._pollers = None
        self.fd = -1
        self.reactions = None

    def bye_frames(self) -> list:
        """The BYE that close() sends."""
        return [P.BYE]

    def _await_bye(self, timeout: float) -> None:
        """Wait (up to ``timeout``) for the broker's answer to our BYE,
        which it sends once it has forgotten this session: the socket
        closes only then, so nothing the broker does next finds it gone (a
        WANT for the subscriptions that a PubSub of the same client drops
        right after counted this connection lost).  What else arrives
        meanwhile is dropped: the session is closing."""
        sock = self.sock
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(max(1, math.ceil(left * 1000))):
                return
            try:
                while True:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                    if frames and frames[0] == P.BYE:
                        return
            except zmq.Again:
                continue
            except zmq.ZMQError:
                return

    def handshake_failure(self) -> str | None:
        """Why the CURVE handshake with the broker failed, if it did and has
        not succeeded since (the lock held); None without CURVE."""
        mon = self.monitor
        if mon is None:
            return None
        from zmq.utils.monitor import recv_monitor_message
        while mon.poll(0):
            event = recv_monitor_message(mon)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._handshake_failure = None
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._handshake_failure = "refused this client's CURVE key (not among the keys it accepts)"
            else:
                self._handshake_failure = ("failed the CURVE handshake with this client (a wrong broker key "
                                           "given as curve_server_key, or not a CURVE broker?)")
        return self._handshake_failure

    def __del__(self) -> None:
        # Not at close(): another thread may still wake() it, and a closed
        # descriptor's number can be reused by anything.
        for fd in (getattr(self, "_wake_r", -1), getattr(self, "_wake_w", -1)):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass

    # -- holding the lock: every taking of it goes through these ---------------

    def attempt(self) -> _Attempt:
        """``with s.attempt() as held:`` the lock if it is free now (``held``
        True), let go of by release() when the block ends."""
        return _Attempt(self)

    def hold(self, timeout: float = -1) -> bool:
        """Take the lock, waiting up to ``timeout`` seconds (-1: for ever);
        True if held (let go of by release())."""
        return self.lock.acquire(False) or (timeout != 0 and self.lock.acquire(True, timeout))

    def drive(self) -> _Driver:
        """A user thread starts driving the session: the keeper (and the
        native reader) leave it alone until ``undrive(token)`` with the
        token returned."""
        token = _Driver(self.reader)
        self.drivers.append(token)        # list.append/remove are atomic: no lost update between threads
        if token.reader is not None:
            token.reader.owner_enter()
        return token

    def drive_from(self, loop: object, wake_fd: int | None = None,
                   on_input: Callable[[], None] | None = None) -> None:
        """An event loop drives the session from now on (the keeper leaves
        it alone).  ``wake_fd``: a descriptor the loop watches, for what a
        native thread of the session's hands it (see ``open_native``);
        ``on_input()``: called (any thread) when input was read while
        letting go of the lock (``drain``), which the loop would not
        otherwise hear of: a coroutine waiting for it looks again."""
        self.hold()
        try:
            self.loop = loop
            self.loop_wake_fd = wake_fd
            self.loop_input = on_input
            if self.sock is not None:
                self.open_native()
        finally:
            self.release()

    def close_within(self, timeout: float, close: Callable[[], None] | None = None) -> bool:
        """Close the session (``close``: how, default close()) once its lock
        is free, waiting up to ``timeout`` seconds for a holder (woken: it
        sees its session closing); False if it was not."""
        self.closing = True
        self.wake()
        if not self.hold(timeout):
            return False
        try:
            (close or self.close)()
        finally:
            self.lock.release()           # nothing to read or run on a closed session
        return True

    def run_posted(self) -> None:
        """Run the work other threads posted (the lock held)."""
        posted = self.posted
        while posted:
            posted.popleft()()

    # -- the native threads (csrc/fb_reader.h, fb_sender.h) -------------------

    def open_native(self) -> None:
        """Start the session's native threads, if it has any, the lock held
        (at open, and when a loop starts driving it).  None here."""

    def make_reactions(self, sock: object) -> _engine.Reactions:
        """What C answers of what the broker says on this connection, the
        moment whichever thread reads it (csrc/fb_react.h): the liveness
        ping on the session's clock and the PONGs that say the broker is
        the same one, and on a Stream the broker's TOOK."""
        return _engine.Reactions(sock, ping=(P.PING, P.PONG, self.options.ping_interval), took_command=P.TOOK)

    def adopt_reader(self, reader: _engine.Reader) -> None:
        """The native reader just started for this session (the lock held)."""
        self.reader = reader

    @property
    def next_ping(self) -> float:
        """When the liveness ping is due (``time.monotonic()``): whoever
        holds the lock then sends it (``reactions.ping_if_due``), the
        native reader or a user thread that reads."""
        r = self.reactions
        return r.next_ping if r is not None else self._next_ping

    @next_ping.setter
    def next_ping(self, when: float) -> None:
        self._next_ping = when
        if self.reactions is not None:
            self.reactions.next_ping = when

    @property
    def instance(self) -> bytes:
        """The broker's instance, from its WELCOME (or a PONG)."""
        return self._instance

    @instance.setter
    def instance(self, value: bytes) -> None:
        self._instance = value
        if self.reactions is not None:
            self.reactions.instance = value   # (its liveness PONGs taken in C: the lock is held)

    def native_owner_fd(self) -> int | None:
        """Where a native thread of this session wakes whoever serves it:
        the keeper, or the loop that drives it (None until one does: then
        nothing native is started)."""
        return self.loop_wake_fd if self.conns.driven_by_loop else self._keeper.wake_fd

    # -- handing work over ------------------------------------------------------

    def post(self, work: Callable[[], None]) -> None:
        """Run ``work`` with the lock held: now if it is free, else by the
        holder before it lets go (woken if it waits)."""
        if self.lock.acquire(False):
            try:
                work()
            finally:
                self.release()
            return
        self.posted.append(work)
        self.wake()
        self._keeper.wake()
        # The holder may have let go between our try and the append:
        # release() looks again after letting go, so the work is not left.
        if self.lock.acquire(False):
            self.release()

    def wake(self) -> None:
        """Wake a holder blocked in wait() (any thread)."""
        try:
            os.write(self._wake_w, b"\x00")
        except (BlockingIOError, OSError):
            pass    # the pipe is full (already woken) or closed

    def release(self) -> None:
        """Let go of the lock: run posted work and read pending input first,
        and look again afterwards for work posted meanwhile."""
        while True:
            try:
                self.run_posted()
                self.drain()
            finally:
                self.lock.release()
            self.keeper_may_look()
            if not self.posted or not self.lock.acquire(False):
                return

    def undrive(self, token: _Driver) -> None:
        """A user thread stops driving the session (its token from
        ``drive()``); the keeper looks again if it skipped the session, and
        the native reader steps in if no user thread is back soon."""
        self.drivers.remove(token)
        if token.reader is not None:
            token.reader.owner_leave()    # (the reader it entered, even if the session was reopened since)
        self.keeper_may_look()

    def keeper_may_look(self) -> None:
        """After letting go of the lock: the keeper found this session
        busy and went to sleep without watching its socket (it cannot tell
        input meant for it from input its holder is reading): wake it, so
        that what arrives from now on is read (a WANT answered) even if no
        user thread takes the session again.  A native reader that found
        the lock taken (or its queue full) is woken the same way."""
        if self.reader is not None:
            self.reader.let_go()
        if self.keeper_skipped:
            self.keeper_skipped = False
            self._keeper.wake()

    def drain(self) -> None:
        """Read what the socket holds now, if a send since the last read to
        the end may have hidden it from the keeper (the lock held).  Input
        a reader left (``more``) waits for its next call, or for the keeper
        (at its next turn, at most a ping interval away)."""
        sock = self.sock
        if sock is None or not self.unread:
            return
        try:
            if (self.more or _events(sock) & POLLIN) and self.reading():
                # (A loop's coroutine that sent, let go and now waits for
                # the answer, a flush's PONG: read here, nobody else hears
                # of it; read() tells the loop.)
                self.read()
            else:
                self.unread = False
            if self.outq:
                self.flush_outq()
        except zmq.ZMQError as exc:
            log.warning("%s: %s session: %s", self.options.name, self.kind, exc)
        if self.more and self.reading() and self.loop is None and len(self.drivers) <= 1:
            if self.reader is not None:
                self.reader.wake()        # it reads on when we let go
            else:
                self._keeper.wake()

    # -- sending (the lock held) ------------------------------------------------

    def _send_failed(self, exc: zmq.ZMQError) -> None:
        log.warning("%s: send to %s failed: %s", self.options.name, self.options.endpoint, exc)

    def send(self, frames: list) -> bool:
        """Send a control message now, or queue it behind those waiting for
        room; True if it left now."""
        if self.sock is None:
            return False
        if not self.outq:
            self.unread = True
            try:
                send_frames(self.sock, frames)
                return True
            except zmq.Again:
                pass
            except zmq.ZMQError as exc:
                self._send_failed(exc)
                return False
        self.outq.append(frames)
        return False

    def send_data(self, frames: list) -> bool:
        """Send a data message if the socket takes it now (False: it did not)."""
        if self.outq:
            self.flush_outq()                  # control messages first, in order
        if self.sock is None or self.outq:
            return False
        self.unread = True
        try:
            send_frames(self.sock, frames)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            self._send_failed(exc)
            return False

    def flush_outq(self) -> None:
        sock = self.sock
        self.unread = True
        while self.outq and sock is not None:
            try:
                send_frames(sock, self.outq[0])
            except zmq.Again:
                return
            except zmq.ZMQError as exc:
                self._send_failed(exc)
            self.outq.popleft()

    # -- reading (the lock held) ------------------------------------------------

    def read(self, budget: int = READ_BUDGET) -> int:
        """Handle up to ``budget`` messages from the broker; ``more`` says
        whether the socket may still hold some.  (A reader that wants one
        message reads with budget 1 and leaves ``more`` set: its next wait
        polls the socket, which says at once whether more is there.)

        On a session an event loop drives, whatever was read is said to the
        loop (``loop_input``): its coroutines share the session, and what
        one reads (a CONFIRM, data) may be what another awaits, which
        nobody else would wake (the native reader wakes the loop only for
        what it reads itself)."""
        n = self._read(budget)
        if n and self.loop_input is not None:
            self.loop_input()
        return n

    def _read(self, budget: int) -> int:
        sock = self.sock
        reader = self.reader
        n = 0
        ready = self.ready
        self.ready = False
        while n < budget:
            if not self.reading():
                self.more = True           # input may wait: read when there is room
                return n
            # What the native reader took off the socket came first (its
            # reactions applied by it).
            frames = reader.pop() if reader is not None else None
            if frames is not None:
                self.via_reader = True
                n += 1
                self.handle(frames)
                continue
            self.via_reader = False
            frames = recv_frames(sock, ready)
            ready = False
            if frames is None:
                self.more = self.unread = False
                self.check_lost()
                return n
            n += 1
            self.react(frames)
        self.more = True
        return n

    def check_lost(self) -> None:
        """Nothing more to read: did the connection go (a Stream says so
        once, to whichever of its readers asks first)?"""
        take = getattr(self.sock, "take_lost", None)
        if take is not None and take():
            self.on_lost()

    def on_lost(self) -> None:
        """The connection went; the Stream connects again by itself."""

    def react(self, frames: list) -> None:
        """One message this thread read off the socket: what the
        connection's reactions take is applied in C (as the native reader
        applies what it reads), the rest handled here."""
        fate = self.reactions.take(frames)
        if fate < 0:
            self.handle(frames)
        elif fate:
            self.on_ack_due(fate)

    def on_ack_due(self, seq: int) -> None:
        """An ACK of ``seq`` is due that the socket did not take when the
        reactions applied what made it due: send it our own way."""

    def handle(self, frames: list) -> None:
        """One message from the broker; a bad one is logged and dropped."""
        try:
            self.on_message(frames[0], frames)
        except (P.ProtocolError, ValueError, IndexError) as exc:
            log.warning("%s: bad message from the broker: %s", self.options.name, exc)

    def reading(self) -> bool:
        """May input be read now (False while a PubSub's inbox is full)?"""
        return True

    def on_message(self, cmd: bytes, frames: list) -> None:
        if cmd == P.WELCOME:
            info = P.load_json(frames[1])
            self.welcome = info
            self.instance = str(info.get("instance", "")).encode()
            limits = info.get("limits")
            self.limits = limits if isinstance(limits, dict) else {}
            self.resyncing = False
            self._resume_connection(info)
            self.on_welcome()
        elif cmd == P.PONG and len(frames) in (3, 4):
            token, instance = frames[1], frames[2]
            if self.instance and instance != self.instance:
                self.instance = instance
                self.resync(BROKER_RESTARTED)
            self.on_pong(token, P.unpack_u64(frames[3]) if len(frames) == 4 else None)
        elif cmd == P.KICK:
            info = P.load_json(frames[1])
            reason = str(info.get("reason", ""))
            if info.get("durable") and info.get("refused") is True:
                self.refuse(info)
                return
            if self.resyncing:
                # A KICK in answer to what we sent before our new HELLO (a
                # restarted broker asks for one, as the PONG said): that
                # HELLO is on its way; one event, one notice.
                return
            self.resync(reason)
        elif cmd == P.PING or cmd == P.TOOK:
            pass                     # a liveness probe: nothing to answer; a TOOK the reactions did not
                                     # take: a pyzmq socket keeps nothing (or a malformed count)
        elif cmd == P.LOST_LOCAL:
            self.on_lost()           # (queued by the native reader: csrc/fb_reader.h lost)
        else:
            raise P.ProtocolError(f"unexpected {cmd!r} on a {self.kind} session")

    def limit(self, name: str, default: int = 0) -> int:
        """A limit the broker announced in WELCOME (default until then)."""
        v = self.limits.get(name)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default

    def on_welcome(self) -> None:
        pass

    def refuse(self, info: dict) -> None:
        """The broker refused a durable session this session never asked for."""
        raise P.ProtocolError(f"unexpected durable refusal: {info.get('reason', '')}")

    def _resume_connection(self, info: dict) -> None:
        """What the connection kept (csrc/fb_zmtp.h resend) after a WELCOME:
        the broker's session went on (what it did not get goes again), or
        is new (what went on the lost connection is not sent again; a
        SubSession sends its whole state anew)."""
        s = self.sock
        if isinstance(s, zmq.Socket) or s is None:
            return
        if not info.get("linger"):
            s.set_resend(b"", 0)          # a broker that keeps no session: nothing to send again
            return
        how = "resumed" if info.get("resumed") else "fresh-drop" if self.kind == "sub" else "fresh"
        before = s.unacknowledged_records(P.PUB) if how == "fresh" else 0
        dropped = s.resume(info.get("received", 0), how)
        if dropped:
            # The messages in the batches that went on the lost connection:
            # the broker that took them is gone.
            self.on_unacknowledged(dropped, before - s.unacknowledged_records(P.PUB))

    def on_unacknowledged(self, n: int, records: int) -> None:
        """``n`` messages (``records`` records in PUB batches) went on a
        lost connection to a broker that does not have this session any
        more: they may not have arrived."""

    def on_pong(self, token: bytes, lease_us: int | None) -> None:
        """A PONG for a ping of ours (``lease_us``: the lease it grants a
        session that acknowledges)."""

    # -- the session ------------------------------------------------------------

    def hello(self) -> None:
        hello = {"v": P.VERSION, "role": "client", "pub": self.kind == "pub", "name": self.options.name,
                 "headers": True, "headers_again": True}
        if self.acks:
            hello["ack"] = True
        hello.update(self.hello_fields())
        self.send([P.HELLO, P.dump_json(hello)])

    def hello_fields(self) -> dict:
        """What this kind of session adds to its HELLO."""
        return {"session": self.session_id}

    def ping(self, token: bytes = b"") -> None:
        """Send a PING (its PONG comes back behind everything the broker
        sent before it; a lease ping is the reactions', lease_ping)."""
        self.send([P.PING, token])

    def resync(self, why: str) -> None:
        log.info("%s: resending to %s (%s)", self.options.name, self.options.endpoint, why)
        self.resyncing = True
        self.hello()

    def tick(self, now: float) -> None:
        """Ping the broker when due (a restarted broker shows in the PONG):
        the reactions' ping, on their clock, as the native reader's."""
        if self.reactions is not None:
            self.reactions.ping_if_due()

    def due_in(self, now: float) -> float | None:
        """Seconds until this session needs serving again (0: now), if
        nothing arrives meanwhile (input: the native reader's, if any);
        None: only when something arrives or wakes the keeper (a native
        reader that pings: no Python thread wakes for a client at rest)."""
        if self.posted or (self.more and self.reading() and (self.reader is None or self._data_owed())):
            return 0.0
        if self.reader is not None:
            # Control frames that met a full socket go when it has room
            # (a ZMQ_FD edge we may have missed: look again soon).
            return OUTQ_BACKSTOP if self.outq else None
        return max(0.0, self.next_ping - now)

    def serve(self, now: float) -> None:
        """What the keeper (or an event loop) does for an undriven session."""
        if self.outq:
            self.flush_outq()
        # With a native reader, only when it queued something to look at
        # (a confirmation, a PONG): data waits for the user's next read,
        # unless it is ours to take (what a read's budget left too).
        if self.reader is None or self.reader.take_handed() or self._data_owed():
            self.read()
        self.tick(now)

    def _data_owed(self) -> bool:
        """Does the native reader hold input the keeper must take now?"""
        return self.wake_on_data and self.reader is not None and self.reader.queued > 0

    # -- a user thread waiting (the lock held) ----------------------------------

    def wait(self, deadline: float | None) -> None:
        """Block until input, posted work or a wake, ``deadline``, or the
        next ping (whichever comes first).  (``wait_many`` for one session,
        written out: a reader waits here for every message.)"""
        if self.posted or self.more:
            ms = 0
        else:
            until = self.next_ping if deadline is None or deadline > self.next_ping else deadline
            ms = math.ceil((until - time.monotonic()) * 1000)
            if ms < 0:
                ms = 0
        out = self.outq or self.blocked
        if ms and (self.buffered() or self.reader_holds()):
            ms = 0
            self.more = True
        if self._pollers is not None:
            ready = self._pollers[1 if out else 0].poll(ms)
        else:
            ready = _zmq_poll(self._items_out if out else self._items, ms)
        for what, _ev in ready:
            if what == self._polled:          # (an fd comes back as a new int)
                self.more = self.ready = True
            else:
                try:
                    os.read(self._wake_r, 4096)
                except (BlockingIOError, OSError):
                    pass
        if out:
            self.flush_outq()
        now = time.monotonic()
        if now >= self.next_ping:
            self.tick(now)


class _Driver:
    """A user thread's turn at driving a session (Session.drive)."""

    __slots__ = ("reader",)

    def __init__(self, reader) -> None:
        self.reader = reader


class _Attempt:
    """Session.attempt()'s block (a class, not a generator: it is on the
    path of an event loop's every read)."""

    __slots__ = ("session", "held")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.held = False

    def __enter__(self) -> bool:
        self.held = self.session.lock.acquire(False)
        return self.held

    def __exit__(self, *exc: object) -> None:
        if self.held:
            self.session.release()


def wait_many(sessions: list[Session], deadline: float | None) -> None:
    """Block until one of ``sessions`` (whose locks the caller holds) has
    input or posted work, or until ``deadline`` or the next ping due; pings
    that are due go out.  ``wait_many([s], d)`` is ``s.wait(d)``."""
    now = time.monotonic()
    until = min(s.next_ping for s in sessions)
    if deadline is not None:
        until = min(until, deadline)
    items = []
    for s in sessions:
        items += s._items_out if s.outq or s.blocked else s._items
    if any(s.posted or s.more for s in sessions):
        ms = 0
    else:
        ms = max(0, math.ceil((until - now) * 1000))
    for s in sessions:
        if ms and (s.buffered() or s.reader_holds()):
            ms = 0
            s.more = True
    ready = dict(_zmq_poll(items, ms))
    for s in sessions:
        if s._wake_r in ready:
            try:
                os.read(s._wake_r, 4096)
            except (BlockingIOError, OSError):
                pass
        if s.outq or s.blocked:
            s.flush_outq()
        if s.sock is not None and s._polled in ready:
            s.more = s.ready = True
        s.tick(time.monotonic())


class driving:
    """``with driving(sessions, deadline) as held:`` hold the locks of
    ``sessions`` as a user thread that waits on them (the keeper and the
    native readers leave them alone meanwhile); ``held`` is False if the
    locks could not be had before ``deadline``.  They are let go of
    (release()) when the block ends.  (A class, not a generator: it is on
    the path of every message a reader waits for, PubSub._fill.)"""

    __slots__ = ("sessions", "deadline", "tokens", "held")

    def __init__(self, sessions: list[Session], deadline: float | None) -> None:
        self.sessions = sessions
        self.deadline = deadline
        self.tokens: list[_Driver] = []
        self.held: list[Session] = []

    def __enter__(self) -> bool:
        sessions, deadline = self.sessions, self.deadline
        self.tokens = [s.drive() for s in sessions]
        try:
            for s in sessions:
                left = -1 if deadline is None else max(0.0, deadline - time.monotonic())
                if not s.hold(left):
                    break
                self.held.append(s)
        except BaseException:
            self.__exit__()
            raise
        return len(self.held) == len(sessions)

    def __exit__(self, *exc: object) -> None:
        held, self.held = self.held, []
        try:
            for s in reversed(held):
                s.release()
        finally:
            tokens, self.tokens = self.tokens, []
            for s, token in zip(self.sessions, tokens):
                s.undrive(token)
