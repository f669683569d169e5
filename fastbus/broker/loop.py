"""The broker itself (:class:`Broker`): lifecycle, the poll loop, periodic
maintenance and stats; it wires the other modules of fastbus.broker
together and adds and removes links.

(This file is over 700 lines because ``Broker`` is the one place that wires
the broker's modules together and owns their lifecycle: start and stop, the
loop, maintenance, links added and removed, and the stats snapshot; what
each step does lives in the module it calls.)

One thread runs :meth:`Broker.run`.  Its poll is the data plane's
``Relay.wait()`` (fastbus/broker/_relay.pyx): in C, without the
interpreter lock, it waits on the sockets and routes and sends known
sessions' PUBs itself, turn after turn.  It returns to this loop only for
what is Python's: a control message (handled by fastbus.broker.sessions),
another socket, batches Python must send (slow subscribers' queues, the
upstream: fastbus.broker.sending), or a deadline (maintenance, a
confirmation's wait, the upstream's lease, a lingering batch).  Nothing on
the message path waits for a timer.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import stat
import threading
import time
from typing import Any

import zmq

from fastbus import protocol as P
from fastbus._core import Router, Trie
from fastbus._types import Buffer
from fastbus.errors import AddressInUse, BrokerTimeout, InvalidConfig, JournalError, ListenError

from ._libzmq import listener as _listener, relay as _relay
from .compat import Compat
from .config import RECV_BUDGET, BrokerConfig
from .federation import Upstream
from .interest import Interest
from .journal import Journal
from .links import Link, LinkTable, Session, count_in
from .memory import GiveBack, fix_mmap_threshold
from .sending import Sender
from .sessions import Sessions
from .settle import Settler

log = logging.getLogger("fastbus.broker")

#: What the broker holds of what one peer sent and it has not read yet: at
#: most RECV_HWM messages in ZeroMQ's pipe for that connection (ZeroMQ
#: counts messages, not bytes; a publisher's batch is at most its
#: max_bytes, 64 KiB by default, so 1 MiB) plus RECV_BUF bytes of kernel
#: socket buffer (fixed: loopback autotuning grows one to tcp_rmem's
#: maximum, 32 MiB on some systems).  Small, because this is what reaches
#: the broker after a FLOW pause (docs/PROTOCOL.md, flow control) and what
#: a flood of large SUB frames makes it hold; the loop reads up to
#: RECV_BUDGET messages a turn from the socket anyway, and the I/O thread
#: refills the pipe as it empties (measured: throughput unchanged).  With
#: the broker's own Listener nothing is read ahead of the relay: it holds
#: what one read brings (64 KiB, or one message up to max_message_bytes)
#: beside the RECV_BUF of kernel buffer.
RECV_HWM = 16
RECV_BUF = 256 * 1024
#: Seconds a client connection has to finish its ZMTP handshake (libzmq's
#: ZMQ_HANDSHAKE_IVL default, which the broker's own Listener keeps).
HANDSHAKE_TIMEOUT = 30.0

_COUNTERS = ("batches_in", "messages_in", "bytes_in", "batches_out", "messages_out", "bytes_out",
             "peers_joined", "peers_left", "subscribe_ops", "unsubscribe_ops", "control_in",
             "flow_pauses", "flow_timeouts", "control_collapsed", "memory_trims", "gap_notices",
             "ack_timeouts", "sessions_detached", "sessions_resumed", "sessions_expired", "messages_replayed",
             "resume_lost", "durable_taken_over", "no_responders", "queue_group_handed_over",
             "held_kept", "held_given", "held_purged")
_DROPS = ("slow_consumer", "unrouted", "malformed", "oversize", "protocol", "unknown_peer", "not_subscribed",
          "too_many_subscriptions", "not_a_broker", "disconnected_slow", "unreachable", "internal",
          "resume_refused", "session_expired", "durable_in_use", "resp_auth", "held_full",
          "held_expired")


class Broker:
    """A fastbus broker.  ``Broker(config).run()`` serves in the calling
    thread until :meth:`stop`; ``start()`` runs it in a background thread,
    and the broker is a context manager::

        with Broker(BrokerConfig(bind=["tcp://127.0.0.1:6464"])) as b:
            ...   # clients connect to tcp://127.0.0.1:6464

    Latency in your own process: ``fastbus broker`` calls ``gc.collect()``
    then ``gc.freeze()`` after start-up, so that Python's full collections
    do not walk the import-time heap (that paused its loop 8-21 ms).  The
    broker does not do it for you: the heap is your program's.  A process
    that only serves a broker may do the same after importing everything.
    """

    def __init__(self, config: BrokerConfig | None = None, *, context: zmq.Context | None = None,
                 **overrides: Any) -> None:
        config = config or BrokerConfig()
        for k, v in overrides.items():
            if not hasattr(config, k):
                raise TypeError(f"unknown broker setting {k!r}")
            setattr(config, k, v)
        config.check()
        self.config = config
        self.instance = P.new_instance_id()
        self._ctx = context or zmq.Context.instance()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self._stop_requested = False
        self._wake_addr = f"inproc://fastbus-broker-wake-{id(self):x}"
        self._stats_lock = threading.Lock()
        self._stats_snapshot: dict = {}
        self.endpoints: list[str] = []    # the bound endpoints, ports resolved
        self.resp_endpoints: list[str] = []   # ... and those Redis clients connect on (--resp)
        #: Who reads the client endpoints: "fastbus" (the broker's own Listener) or "libzmq".
        self.transport = "libzmq"
        #: The monitoring HTTP server (config.http) and what it serves.
        self.monitor = None
        self.http_url: str | None = None
        self._ipc_files: list[tuple[str, int, int]] = []   # (path, st_dev, st_ino) of bound ipc sockets
        self._auth = None

    # -- lifecycle ---------------------------------------------------------

    def start(self, timeout: float = 10.0) -> Broker:
        """Run in a background thread; returns once the sockets are bound."""
        if self._thread is not None:
            raise RuntimeError("broker already started")
        self._thread = threading.Thread(target=self._thread_main, name=f"fastbus-broker-{self.config.name}",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            where = ", ".join(self.config.bind)
            raise BrokerTimeout(f"broker {self.config.name!r} on {where} did not start within {timeout:g} s "
                                f"(its loop thread is still setting up)", self.config.bind[0])
        if self._error is not None:
            raise self._error
        return self

    def _thread_main(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # reported by start() or stop()
            self._error = exc
            self._ready.set()

    def request_stop(self) -> None:
        """Ask the loop to finish (safe from a signal handler); returns at once."""
        self._stop_requested = True
        try:
            s = self._ctx.socket(zmq.PAIR)
            s.linger = 0
            s.connect(self._wake_addr)
            s.send(b"stop", zmq.NOBLOCK)
            s.close()
        except zmq.ZMQError:
            pass

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (from any thread) and wait: pending batches are sent
        first."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                where = ", ".join(self.endpoints or self.config.bind)
                raise BrokerTimeout(f"broker {self.config.name!r} on {where} did not stop within {timeout:g} s",
                                    (self.endpoints or self.config.bind)[0])
        if self._error is not None and not isinstance(self._error, KeyboardInterrupt):
            raise self._error

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """The first bound client endpoint (with the real port if 0 was asked)."""
        return self.endpoints[0]

    def stats(self) -> dict[str, Any]:
        """A snapshot of the counters (updated by the loop about once a
        second, thread-safe; empty before the loop's first snapshot).

        Keys: ``name`` (str), ``instance`` (str), ``uptime_s`` (float),
        ``endpoints`` (list[str]), ``peers`` (int), ``links`` (dict[str, int]:
        links by role), ``publishers``, ``subscriptions``, ``keys`` (int),
        ``upstream`` (``{"endpoint": str, "connected": bool}`` or None), the
        cumulative counters (int) ``batches_in``, ``messages_in``,
        ``bytes_in``, ``batches_out``, ``messages_out``, ``bytes_out``,
        ``peers_joined``, ``peers_left``, ``subscribe_ops``,
        ``unsubscribe_ops``, ``control_in``, ``flow_pauses``,
        ``flow_timeouts``, ``control_collapsed``, ``memory_trims``,
        ``gap_notices``, ``deliveries``; ``drops`` (dict[str, int], by
        reason), ``queued_bytes`` (int) and ``flow_paused`` (bool)."""
        with self._stats_lock:
            return dict(self._stats_snapshot)

    # -- setup -------------------------------------------------------------

    def _setup(self) -> None:
        cfg = self.config
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self.drops = dict.fromkeys(_DROPS, 0)
        self.trie = Trie()
        self.router = Router(self.trie, max_messages=cfg.max_messages, max_bytes=cfg.max_bytes,
                             max_delay=cfg.max_delay, max_topic=cfg.max_topic, max_payload=cfg.max_payload)
        self.links = LinkTable()
        self.sender = Sender(self.links, cfg, self.counters, self.drops, self.remove_link, self.detach_link)
        self.interest = Interest(self.trie, self.router, self.links, self.sender.send, cfg, self.counters,
                                 self.drops)
        self.sender.want_reset = self.interest.want_reset
        self.interest.flush_full = self.sender.flush_full
        self.router.set_held_limit(cfg.max_held_bytes)
        self.settler = Settler(self.links, self._reply, cfg.filter_lease, cfg.upstream_confirm_timeout,
                               self.counters, self.lease_end)
        self.handlers: dict = {}                   # socket -> what to call when it is readable
        self._started = time.monotonic()
        self._next_stats_log = self._started + (cfg.stats_interval or 0)
        fix_mmap_threshold()
        self._give_back = GiveBack(self.counters)
        self._last_stats_line: tuple | None = None

        self._wake = self._ctx.socket(zmq.PAIR)
        self._wake.bind(self._wake_addr)
        self._sock = self._router_socket()
        # The data plane, in C (_relay.pyx): it polls, routes, sends and
        # queues for slow links, under the slow-consumer policy.
        self.relay = _relay(self.router, self._sock)
        self.relay.budget = RECV_BUDGET
        self.sender.attach(self.relay)
        self.sessions = Sessions(self, self._sock)
        self.handlers[self._sock] = self.sessions.on_readable
        self.upstream = Upstream(self) if cfg.upstream else None
        if self.upstream is not None:
            self.handlers[self.upstream.sock] = self.upstream.on_readable
        # What lingering sessions are owed survives a kill (--journal): the
        # sessions it holds linger again before anything is served.
        self.journal = Journal(self) if cfg.journal else None
        self.interest.journal = self.journal          # (held groups' declarations)
        if self.journal is not None:
            try:
                self.journal.start()
            except OSError as exc:
                raise JournalError(f"the journal at {cfg.journal} cannot be used: {exc.strerror or exc}",
                                   cfg.journal, exc.errno) from exc
        # Sessions' lease pings answered in C, with the configured lease;
        # under an upstream the lease is bounded by ours from it, which
        # only Python knows (lease_grant_us), so Python answers them.
        self.relay.answer_leases(self.instance, cfg.filter_lease if self.upstream is None else 0.0)
        self.compat = Compat(self)
        if cfg.http:
            try:
                self._start_monitor()
            except BaseException:
                self._teardown()
                raise
        self._publish_stats()

    def _start_monitor(self) -> None:
        """The HTTP endpoints (fastbus.monitor): they read the snapshots
        that maintenance publishes, never the loop's state."""
        from fastbus.monitor.broker import BrokerSource
        from fastbus.monitor.http import MonitorServer
        cfg = self.config
        source = BrokerSource(self, max_age=cfg.http_max_age)
        server = MonitorServer(source, cfg.http, allow_remote=cfg.allow_remote).start()
        self.monitor, self._monitor_server = source, server
        self.http_url = server.url
        log.info("monitoring on %s (/metrics, /varz, /connz, /subsz, /healthz)", server.url)

    def _router_socket(self):
        """The ROUTER socket for sessions, bound to every client endpoint:
        the broker's own (a Listener, fastbus/broker/_listener.pxi: the
        relay's thread reads and writes the connections, so a message
        crosses no thread here) where it can be, else libzmq's (CURVE, an
        inproc:// endpoint, or FASTBUS_BROKER_TRANSPORT=libzmq)."""
        cfg = self.config
        listener = _listener()
        if (listener is not None and not cfg.curve_secret_key
                and os.environ.get("FASTBUS_BROKER_TRANSPORT", "fastbus") != "libzmq"
                and all(listener.supports(ep) for ep in cfg.bind + cfg.resp)):
            # libzmq's ROUTER below, in the same terms: sndhwm whole
            # messages per peer beyond the kernel's buffers, TCP keepalive
            # for half-open connections, the message size limit.  Nothing
            # is read ahead of the relay (libzmq's rcvhwm has no twin).
            r = listener(sndhwm=16, rcvbuf=RECV_BUF, maxmsgsize=cfg.max_message_bytes,
                         tcp_keepalive_idle=int(cfg.heartbeat_timeout),
                         tcp_keepalive_intvl=max(1, int(cfg.probe_interval)), tcp_keepalive_cnt=3,
                         resp_auth_required=cfg.resp_password is not None or bool(cfg.resp_users))
            self.transport = "fastbus"
        elif cfg.resp:
            raise InvalidConfig("--resp needs the broker's own transport (Linux, tcp:// or ipc:// endpoints, "
                                "no FASTBUS_BROKER_TRANSPORT=libzmq)")
        else:
            r = self._libzmq_router()
            self.transport = "libzmq"
        try:
            for ep in cfg.bind:
                self.bind(r, ep)
                self.endpoints.append(r.last_endpoint.decode())
            for ep in cfg.resp:
                self.bind(r, ep, resp=True)
                self.resp_endpoints.append(r.last_endpoint.decode())
                log.info("Redis clients (RESP) connect on %s", self.resp_endpoints[-1])
        except BaseException:
            r.close(linger=0)
            raise
        return r

    def _libzmq_router(self) -> zmq.Socket:
        """libzmq's ROUTER socket for sessions (unbound)."""
        cfg = self.config
        r = self._ctx.socket(zmq.ROUTER)
        r.ipv6 = True                      # tcp://[::1]:PORT too (IPv4 endpoints as before)
        r.router_mandatory = 1
        r.linger = 1000
        # Batches held by libzmq per peer.  Small, so that a stalled subscriber
        # soon shows up as EAGAIN and our own accounted queue and slow-consumer
        # policy take over (16 x max_bytes, plus the kernel's socket buffers).
        r.sndhwm = 16
        r.rcvhwm = RECV_HWM
        r.rcvbuf = RECV_BUF
        r.maxmsgsize = cfg.max_message_bytes
        # No ZMTP heartbeat timeouts: heartbeats share the data stream, so a
        # subscriber that is merely slow (not reading) would be cut off as
        # dead, losing its gap count.  A dead process closes its connection
        # (found by the next probe); a slow one is the slow-consumer policy's;
        # TCP keepalive finds half-open connections.
        r.tcp_keepalive = 1
        r.tcp_keepalive_idle = int(cfg.heartbeat_timeout)
        r.tcp_keepalive_intvl = max(1, int(cfg.probe_interval))
        r.tcp_keepalive_cnt = 3
        if cfg.curve_secret_key:
            r.curve_server = True
            r.curve_secretkey = cfg.curve_secret_key.encode()
            r.curve_publickey = cfg.curve_public_key.encode()
            if cfg.curve_allowed is not None or cfg.curve_allowed_brokers is not None:
                # ZAP: who may connect, and each connection's key as its
                # User-Id (how a downstream broker is recognised).
                from zmq.auth.thread import ThreadAuthenticator
                def z85(keys):
                    return {k.encode() if isinstance(k, str) else k for k in keys}
                allowed = None if cfg.curve_allowed is None else \
                    z85(cfg.curve_allowed) | z85(cfg.curve_allowed_brokers or ())
                self._auth = ThreadAuthenticator(self._ctx, log=logging.getLogger("fastbus.broker.auth"))
                self._auth.start()
                # The provider is looked up by the socket's exact ZAP domain.
                self._auth.configure_curve_callback("fastbus", credentials_provider=_AllowedKeys(allowed))
                r.zap_domain = b"fastbus"
        return r

    def bind(self, sock: zmq.Socket, endpoint: str, resp: bool = False) -> None:
        """``sock.bind(endpoint)``; failing, a ListenError (AddressInUse for
        a port or path another process holds) naming the endpoint.  The file
        of an ipc:// endpoint is removed when the broker stops."""
        try:
            if resp:
                sock.bind(endpoint, resp=True)
            else:
                sock.bind(endpoint)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise AddressInUse(f"cannot listen on {endpoint}: address already in use (another broker?)",
                                   endpoint, exc.errno) from None
            raise ListenError(f"cannot listen on {endpoint}: {exc.strerror}", endpoint, exc.errno) from None
        bound = sock.last_endpoint.decode()
        if bound.startswith("ipc://") and not bound.startswith("ipc://@"):
            try:
                st = os.stat(bound[6:])
                self._ipc_files.append((bound[6:], st.st_dev, st.st_ino))
            except OSError:
                pass

    def _remove_ipc_files(self) -> None:
        """Remove the socket files this broker's ipc:// endpoints made (the
        same files: not one another process bound there since)."""
        for path, dev, ino in self._ipc_files:
            try:
                st = os.lstat(path)
                if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == (dev, ino):
                    os.unlink(path)
            except OSError:
                pass
        self._ipc_files.clear()

    # -- links -------------------------------------------------------------

    def add_link(self, link: Link) -> None:
        """A new neighbour: an outbox, and (for a broker) a forwarder."""
        self.links.add(link)
        self.router.add_link(link.link)
        # (A peer that does not read them gets none; repeats only to one that reads them.)
        self.router.set_headers(link.link, link.headers, link.headers_again)
        # A request that entered here from a client and reached nobody is
        # answered at once; one from another broker is that broker's to answer.
        self.router.set_notify(link.link, not link.is_broker)
        # Another broker's records were picked for by its queue groups there
        # (one that has none: by ours here).
        self.router.set_broker(link.link, link.is_broker and link.groups)
        if isinstance(link, Session) and link.sock is self._sock:
            self.relay.add_session(link.link, link.ident, 0, link.acks, link.session_id is not None)
        self.interest.attach(link)
        self.counters["peers_joined"] += 1

    def remove_link(self, link: Link, reason: str) -> None:
        """A neighbour goes: its subscriptions (the diffs travel), its
        outbox and its queue go with it.  Idempotent."""
        if not self.links.is_current(link):
            return
        log.info("peer %s (%s, link %d) left: %s", link.name, link.role, link.link, reason)
        if self.journal is not None and isinstance(link, Session):
            self.journal.ended(link)
        self.relay.remove_link(link.link)
        self.links.remove(link)
        self.settler.forget(link)
        self.interest.detach(link)
        self.router.remove_link(link.link)
        self.sender.forget(link)
        self.counters["peers_left"] += 1
        if isinstance(link, Session):
            self.sessions.forget(link, reason)
            if link.role == "redis" and hasattr(link.sock, "close_peer"):
                link.sock.close_peer(link.ident)   # (Redis closes it; a fastbus client is told instead)

    def detach_link(self, link: Link) -> None:
        """A resumable session's connection is gone: it lingers (the data
        plane queues what is routed to it) until it resumes or
        its linger runs out (_maintenance)."""
        if link.detached_at is None:
            link.detached_at = time.monotonic()
            self.router.set_away(link.link, True)    # (its queue groups pick it last until it resumes)
            self.counters["sessions_detached"] += 1
            log.info("peer %s (link %d) lost its connection: its session is kept %g s", link.name, link.link,
                     link.linger)

    def _expire_sessions(self, now: float) -> None:
        """Lingering sessions whose linger ran out end; what waited for
        them is counted (and said, if their client comes back later)."""
        for link in self.links.snapshot():
            if link.lingering and now - link.detached_at >= (linger := link.linger):
                self.relay.flush_link(link.link)     # (its outbox into its queue: counted with it)
                _detached, sent, _kept, waiting = self.relay.resume_state(link.link)
                # What waited for it, and what went to its connection that
                # its client never said it took (a process killed with it
                # unread, or in a cut connection's buffers), but what its
                # queue groups give another member.
                lost = max(0, waiting + max(0, sent - link.took) - self._hand_over(link))
                self.counters["sessions_expired"] += 1
                self.drops["session_expired"] += lost
                self.sessions.expired(link, lost)
                self.remove_link(link, f"session expired after {linger:g} s without its client "
                                       f"({lost} messages waiting for it dropped)")

    def _hand_over(self, link: Link) -> int:
        """A member of queue groups whose session ran out: what it was
        given for them and never took goes to another member of each (the
        records its client may have taken without saying so come again).
        Returns how many records went."""
        gids = [g.gid for key in link.queues if (g := self.interest.groups.get(key)) is not None]
        if not gids:
            return 0
        handed = 0
        for batch, skip in self.relay.pending(link.link, link.took):
            n, full = self.router.route_to_groups(batch, skip, gids, link.link)
            handed += n
            if full:
                self.sender.flush_full(full)      # (an outbox never past its limits)
        if handed:
            self.counters["queue_group_handed_over"] += handed
            log.info("peer %s (link %d): %d messages it never took handed to its queue groups' other members",
                     link.name, link.link, handed)
        return handed

    def _reply(self, link: Link, frames: list) -> None:
        """A settled reply (fastbus.broker.settle): a CONFIRM handed over is
        remembered, for the WELCOME of a resume (a cut may lose it)."""
        if frames[0] == P.CONFIRM and isinstance(link, Session):
            link.confirmed = P.unpack_u64(frames[1])
            if self.journal is not None:
                self.journal.confirmed(link, link.confirmed)
        self.sender.send(link, frames)

    def route(self, batch: Buffer, source: int | None) -> None:
        """Route a received batch; an outbox it filled goes out at once."""
        full = self.router.receive(batch, source)
        if source is not None:
            link = self.links.by_id.get(source)
            if link is not None:
                count_in(self.relay, link, batch)
        if full:
            self.sender.flush_full(full)

    # -- the loop ----------------------------------------------------------

    def run(self) -> None:
        """Serve until stop() (or KeyboardInterrupt).  ListenError
        (AddressInUse) if an endpoint cannot be bound."""
        try:
            self._setup()
        except BaseException:
            self._teardown()
            raise
        # The sockets the loop watches besides the ROUTER (whose known
        # sessions' PUBs the relay routes itself): each with its handler.
        self._waited = [self._wake, *(s for s in self.handlers if s is not self._sock)]
        self._on_ready = [self._on_wake, *(h for s, h in self.handlers.items() if s is not self._sock)]
        self._ready.set()
        log.info("broker %s listening on %s", self.config.name, ", ".join(self.endpoints))
        on_sessions = self.handlers[self._sock]
        wait = self.relay.wait
        sender = self.sender
        settler = self.settler
        upstream = self.upstream
        guarded = self._guarded
        probe_interval = self.config.probe_interval
        if self.monitor is not None:
            # Maintenance publishes the monitoring snapshot: often enough
            # for /healthz (probes still go only to links idle that long).
            probe_interval = min(probe_interval, self.monitor.interval)
        next_maint = time.monotonic() + probe_interval
        try:
            while not self._stop_requested:
                # Waits, and routes and sends known sessions' PUBs (and
                # retries slow links' queues), in C without the interpreter
                # lock, until something is ours.  During a flow pause it
                # returns after each turn that routed anything.
                for i in wait(self._waited, self._poll_timeout(next_maint), sender.paused):
                    guarded(on_sessions if i < 0 else self._on_ready[i])
                if self.relay.journal_due:
                    guarded(self.journal.compact)    # (the trigger reached this turn: the directory's bound)
                # What this turn brought goes out now, one batch per link.
                guarded(sender.flush_due)
                if settler.dirty or settler.next_deadline <= time.monotonic():
                    guarded(settler.settle, time.monotonic())      # acknowledged, or waited long enough
                now = time.monotonic()
                if upstream is not None and now >= upstream.next_tick:
                    guarded(upstream.tick, now)
                if sender.paused:
                    guarded(sender.check_flow, now)
                if now >= next_maint:
                    guarded(self._maintenance, now)
                    next_maint = now + probe_interval
            self.sender.flush_everything()
            if self.journal is not None:
                self.journal.close()
        finally:
            self._publish_stats()
            if self.monitor is not None:
                self.monitor.stopped()
            st = self._stats_snapshot
            log.info("stopped after %.1f s: %d messages in, %d out, %d peers left, dropped %s",
                     st["uptime_s"], st["messages_in"], st["messages_out"], st["peers"],
                     {k: v for k, v in st["drops"].items() if v} or "nothing")
            self._teardown()
            self._stopped.set()

    def _on_wake(self) -> None:
        """request_stop()'s message (the loop checks the flag each turn)."""
        try:
            self._wake.recv(zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _guarded(self, fn, *args) -> None:
        """Run one step of the loop; an unexpected error (a bug) is logged
        with its traceback and counted, and the broker serves on."""
        try:
            fn(*args)
        except zmq.ContextTerminated:
            raise
        except Exception:
            self.drops["internal"] += 1
            log.exception("internal error in %s; the broker continues", getattr(fn, "__name__", fn))

    def _poll_timeout(self, next_maint: float) -> int:
        """Milliseconds until maintenance or the next lingering batch; 0 if
        a batch is due (the relay retries slow links' queues itself).  None
        of these is what makes a message leave: a readable socket ends the
        poll, and the turn sends what it read.  Only a linger (opt-in)
        waits, rounded up to whole milliseconds (zmq_poll's resolution)."""
        now_ns = time.monotonic_ns()
        t = next_maint - now_ns / 1e9
        d = self.router.deadline_ns()              # None unless an outbox waits (linger, held link)
        if d is not None:
            t = min(t, (d - now_ns) / 1e9)
        # A confirmation that stops waiting for a peer that did not answer
        # (fastbus.broker.settle), and the upstream lease's next renewal.
        t = min(t, self.settler.next_deadline - now_ns / 1e9)
        if self.upstream is not None:
            t = min(t, self.upstream.next_tick - now_ns / 1e9)
        return max(0, math.ceil(t * 1000))

    def lease_grant_us(self) -> int:
        """The lease a PONG or WELCOME grants a session that filters by our
        WANT messages, in microseconds (fastbus.broker.settle): the
        configured filter_lease, but never past the end of our own lease
        from the upstream broker while we have one, for our view is only
        as current as upstream's is of us."""
        lease = self.config.filter_lease
        if self.upstream is not None:
            lease = min(lease, self.upstream.lease_left())
        return max(0, int(lease * 1e6))

    def lease_end(self, link: Link) -> float:
        """When the last filter lease granted to a session ends
        (time.monotonic()): by Python (WELCOME, a PONG it answered) or by
        the data plane (a lease ping it answered), both recorded in the
        data plane's slot for the session (Relay.grant)."""
        return self.relay.lease_end(link.link)

    def _maintenance(self, now: float) -> None:
        # The upstream link stopped reading even its control messages: start
        # its session over (the queue goes, HELLO and our want set are sent).
        if self.sender.overflowed:
            for link in list(self.sender.overflowed):
                self.sender.overflowed.discard(link)
                if self.upstream is not None and link is self.upstream.link and self.links.is_current(link):
                    log.warning("upstream is not reading: resyncing")
                    self.upstream.hello()
        # Probe idle peers: a dead one fails (EHOSTUNREACH) and is removed.
        interval = self.config.probe_interval
        state = self.relay.queue_state
        for link in self.links.snapshot():
            if link.lingering:
                continue                     # nothing to probe
            queued, _blocked, _holding, _exempt, _lost, last_sent = state(link.link)
            frames = link.probe(not queued and now - last_sent >= interval)
            if frames is not None and self.links.is_current(link):
                self.sender.send(link, frames)
        if self.upstream is not None:
            self.upstream.check(now)
        self.sender.check_stuck(now)
        self._expire_sessions(now)
        self.drops["held_expired"] += self.interest.expire_held(now)
        if self.journal is not None:
            self.journal.maintain()
        if self.transport == "fastbus":
            # A connection that never finished its handshake goes (libzmq's
            # ROUTER does the same): idle connections hold no descriptor for good.
            self._sock.expire(HANDSHAKE_TIMEOUT)
        self._publish_stats()
        st = self._stats_snapshot
        i = self.interest
        self._give_back.check(i.released, i.released_bytes, st["subscriptions"], i.total_bytes, st["queued_bytes"])
        if self.config.stats_interval and now >= self._next_stats_log:
            self._next_stats_log = now + self.config.stats_interval
            s = self._stats_snapshot
            line = (s["peers"], s["subscriptions"], s["messages_in"], s["batches_in"], s["messages_out"],
                    str({k: v for k, v in s["drops"].items() if v} or "nothing"))
            if line != self._last_stats_line:           # an idle broker says it once, not every interval
                self._last_stats_line = line
                log.info("peers %d, subscriptions %d, in %d msg (%d batches), out %d msg, dropped %s", *line)

    # -- stats -------------------------------------------------------------

    def stats_dict(self) -> dict[str, Any]:
        """The counters now (the loop's thread only; others call stats())."""
        ts = self.trie.stats()
        rs = self.router.stats()
        roles: dict[str, int] = {}
        for link in self.links.by_id.values():
            roles[link.role] = roles.get(link.role, 0) + 1
        counters = dict(self.counters)
        counters["control_in"] += self.relay.pings_answered      # PINGs the data plane answered
        # What only the data plane's queues do: its book alone.
        counters["gap_notices"] = self.relay.gap_notices
        counters["control_collapsed"] = self.relay.control_collapsed
        counters.update(batches_in=rs["batches"], messages_in=rs["records"], bytes_in=rs["bytes"],
                        no_responders=rs["no_responders"], held_kept=rs["held_kept"], held_given=rs["held_given"])
        relay = self.relay                         # the books of what went out: the data plane's
        counters.update(batches_out=relay.batches_out, messages_out=relay.messages_out, bytes_out=relay.bytes_out)
        drops = dict(self.drops)
        drops["internal"] += relay.dropped
        drops["slow_consumer"] += relay.dropped_slow
        drops["unrouted"] = rs["unrouted"]
        # Given us by another broker for a queue group whose last member
        # here left while they were on their way.
        drops["queue_group_orphaned"] = rs["group_orphaned"]
        # Not kept by a held group: over the sender's capacity or
        # --max-held-bytes (the sender was answered so).
        drops["held_full"] = rs["held_full"]
        drops["malformed"] = self.drops["malformed"] + rs["rejected"]
        up = self.upstream
        return {
            "name": self.config.name, "instance": self.instance.decode(),
            "uptime_s": round(time.monotonic() - self._started, 3),
            "endpoints": self.endpoints,
            "resp_endpoints": self.resp_endpoints,
            "peers": len(self.links.by_ident), "links": roles,
            "publishers": sum(1 for link in self.links.by_id.values() if link.filters),
            "subscriptions": ts["subscriptions"], "keys": ts["keys"],
            # Queue groups held here, and their members (a broker link is one
            # for the members behind it).
            "queue_groups": len(self.interest.groups),
            "queue_group_members": sum(len(g.members) for g in self.interest.groups.values()),
            # Held groups (a work queue that outlives its workers) and what
            # they keep for a member to come.
            "held_groups": len(self.interest.held), "held_messages": self.interest.held_messages(),
            "held_bytes": self.router.held_bytes,
            "held_bindings": sum(len(g.binds) for g in self.interest.held.values()),
            "upstream": {"endpoint": self.config.upstream, "connected": up.connected} if up is not None else None,
            **counters, "deliveries": rs["deliveries"], "drops": drops,
            "queued_bytes": relay.queued_bytes,
            # Sessions whose connection is gone, kept for their client to
            # resume (docs/PROTOCOL.md, "Resuming a session").
            "sessions_lingering": sum(1 for link in self.links.by_id.values() if link.lingering),
            "flow_paused": self.sender.paused,
            # Who reads the client endpoints: the broker itself, with its
            # connections' counters, or libzmq (None: libzmq keeps them).
            "transport": self.transport,
            "connections": self._sock.stats() if self.transport == "fastbus" else None,
            # --journal: its disk, commits and syncs (None without one).
            "journal": self.journal.stats() if self.journal is not None else None,
        }

    def _publish_stats(self) -> None:
        d = self.stats_dict()
        with self._stats_lock:
            self._stats_snapshot = d
        if self.monitor is not None:
            self.monitor.publish(d, self.peer_rows())

    def peer_rows(self) -> list[tuple]:
        """One tuple per link (links.PEER_FIELDS), cheap to build in the
        loop; links.peer_dicts() makes them JSON.  Traffic is the data
        plane's books (Relay.link_counters)."""
        rc = self.relay.link_counters()
        state = self.relay.queue_state
        none = (0, 0, 0, 0, 0, 0)
        rows = []
        for link in self.links.by_id.values():
            queued, blocked, holding, exempt, lost, _last = state(link.link)
            rows.append((link.link, link.name, link.role, link.address, link.publisher, link.subs,
                         queued, blocked, holding, exempt, lost, link.since, *rc.get(link.link, none)))
        return rows

    def _teardown(self) -> None:
        if getattr(self, "monitor", None) is not None:
            self._monitor_server.stop()
        for s in list(getattr(self, "handlers", ())):
            s.close(linger=0 if s is not getattr(self, "_sock", None) else 500)
        wake = getattr(self, "_wake", None)
        if wake is not None:
            wake.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        self._remove_ipc_files()


class _AllowedKeys:
    """CURVE credentials provider: accept exactly these client public keys
    (None: any key)."""

    def __init__(self, keys: set | None) -> None:
        self.keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq passes the client's public key, Z85-encoded."""
        return self.keys is None or key in self.keys
