"""``Client``: a connection to a fastbus broker, the API users call.

Below it, nothing knows it: ``_connections.Connections`` owns its options,
context, keeper and sessions; ``_pubsession.PubSession`` publishes;
``_pubsub.PubSub`` subscribes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Self, TypedDict

import zmq

from fastbus import protocol as P
from fastbus import tracing
from fastbus._core import Outbox
from fastbus._publisher import ClientBase, Publisher
from fastbus._messages import PubSubMessage
from fastbus._types import ChannelT, EncodableT
from fastbus.client._connections import Connections
from fastbus.client._endpoint import AbsenceProbe
from fastbus.client._keys import to_key
from fastbus.client._options import ClientOptions
from fastbus.client._pubsession import PubSession
from fastbus.client._pubsub import PubSub
from fastbus.client._requests import Inbox
from fastbus.client._redis_compat import from_url as _from_url
from fastbus.client._redis_compat import RedisKeywords, redis_options
from fastbus.client._session import driving
from fastbus.errors import BrokerTimeout, ConnectionClosed, FlushTimeout, KeyRefused, MessagesRejected, NoResponders

if TYPE_CHECKING:
    from typing_extensions import Unpack            # (typing's from Python 3.12)

log = logging.getLogger("fastbus.client")

#: How long is_wanted() waits for a filter lease it asked for (a round trip).
LEASE_WAIT = 0.25


class ClientStats(TypedDict):
    """``Client.stats()``: this client's counters."""
    published: int          #: messages queued by publish() (sent or to be sent)
    filtered: int           #: not sent: nobody wanted their channel
    queued: int             #: waiting to be sent
    queued_bytes: int       #: bytes of those
    filter_active: bool     #: is publish() dropping what no subscriber wants now (the broker's view, under its lease)?
    flow_paused: bool       #: has the broker asked publishers to pause (a subscriber is behind)?
    flow_pauses: int        #: how many times it did
    rejected: int           #: messages the broker dropped (over its limits; flush() raises MessagesRejected)
    unfiltered: int         #: sent although the filter would have dropped them: its lease had run out
    unacknowledged_lost: int  #: messages sent on a connection lost with a broker that did not keep the session (a restart)

#: A publish() that starts a batch sends it at once from the publishing
#: thread unless the publisher is in a burst: BURST_LIMIT batches already
#: left that way, each within BURST_GAP seconds of the one before.  Then the
#: native sender thread sends what gathered by the time it runs
#: (csrc/fb_sender.h; the keeper, without the native engine).
BURST_GAP = 20e-6
BURST_LIMIT = 4
#: How long close() waits for the broker to take everything, by default.
CLOSE_TIMEOUT = 5.0


def close_leaving(close: Callable[[], object], failing: bool) -> None:
    """What leaving a client's ``with`` block does: ``close()``, whose
    FlushTimeout or MessagesRejected (messages it could not deliver) is
    raised, unless an exception is already under way (``failing``): that
    is the one to see, and the loss is logged."""
    if not failing:
        close()
        return
    try:
        close()
    except (FlushTimeout, MessagesRejected) as lost:
        log.warning("%s", lost)


class Client(ClientBase):
    """A connection to a fastbus broker (``tcp://host:port``, or
    ``endpoint=`` for ipc:// and inproc://).

    **Publishing** is buffered and batched, with no timer: a message
    published while the client is idle leaves at once, from the calling
    thread; messages published back to back (a burst) gather into a batch
    that the client's native sender thread sends as soon as it runs (it
    never waits for the interpreter lock), and a batch
    that fills (``max_messages`` records or ``max_bytes`` bytes) leaves at
    once.  ``max_delay`` (seconds; default None: no linger) is an optional
    linger for larger batches under load: then a batch waits until
    ``max_delay`` after the previous one (or until full), while a message
    on an idle client still leaves at once.

    At most ``max_buffer_bytes`` wait to be sent; then ``publish()`` blocks
    until there is room, up to ``block_timeout`` seconds (None: no limit),
    and raises :class:`PublishTimeout`.  The buffer fills when the broker is
    unreachable, or when it asks publishers to pause because a subscriber
    fell behind (flow control, see ``BrokerConfig.flow_pause_bytes``).

    **Receiving** (:meth:`pubsub`): a thread in ``get_message()``,
    ``get_batch()`` or ``listen()`` reads the PubSub's connection itself, so
    a message reaches it without a hand-over between threads.  While nobody
    reads, a native thread (no interpreter lock) takes what arrives, up to
    ``max_inbox_bytes`` of received batches (and as much again already
    handed to Python, not yet returned); beyond that the client stops
    reading, so a subscriber that falls behind pushes back on the broker
    (which then pauses publishers, drops its oldest messages with a ``gap``
    notice, or disconnects it, as configured) instead of growing without
    bound.  ``decode_responses=True`` gives str channels and payloads.

    **Subscribing** returns once the subscription is in effect: from then
    on every message any client publishes reaches the subscriber.  With no
    broker to answer, ``subscribe()`` raises :class:`BrokerUnavailable`
    within ``socket_connect_timeout`` seconds (sooner, about a second, when
    nothing listens at the address); a broker that answered but does not
    confirm within ``subscribe_timeout`` (None: no limit) gives
    :class:`BrokerTimeout`.

    CURVE: pass the broker's public key and this client's key pair (Z85
    strings).

    **redis-py's connection keywords** are accepted, so code written for
    ``redis.Redis`` runs unchanged: ``health_check_interval`` sets the
    period of the pings every connection sends anyway (``ping_interval``);
    ``socket_connect_timeout`` is how long ``subscribe()`` waits for a broker
    to answer at all; ``socket_timeout``, if given, is how long a call waits
    for the broker's answer once it answers (``subscribe_timeout``);
    ``client_name`` is ``name``.  ``retry``, ``retry_on_timeout``,
    ``retry_on_error`` and ``socket_keepalive`` are accepted and ignored:
    a fastbus connection reconnects by itself, resends its subscriptions
    and says so (a ``reconnect`` message), and pings its broker every
    ``ping_interval``.  The rest of redis-py's keywords (``db``,
    ``password``, ``max_connections``, ``protocol``, ``encoding``...) are
    accepted too, each honoured or of no effect on a broker, or refused
    with a reason (``ssl=True``): fastbus.client._redis_compat's table,
    README's "Differences from redis-py".  The first argument may be an
    endpoint (``Client("tcp://127.0.0.1:6464")``) or a ``redis://`` URL
    instead of a host; :meth:`from_url` reads one with its options.
    """

    #: Hook for a twin that an event loop drives (:mod:`fastbus.aio` sets it
    #: True): the loop serves its connections instead of the keeper thread
    #: (their native threads wake it), and every starting batch is handed to
    #: the publisher's ``send_now`` (no bursts counted).
    driven_by_loop: bool = False


    def __init__(self, host: str = "127.0.0.1", port: int = P.DEFAULT_PORT, *, endpoint: str | None = None,
                 decode_responses: bool = False, max_messages: int = 1000, max_bytes: int = 64 * 1024,
                 max_delay: float | None = None, curve_server_key: str | None = None,
                 curve_public_key: str | None = None, curve_secret_key: str | None = None,
                 name: str | None = None, context: zmq.Context | None = None,
                 ping_interval: float = 1.0, max_inbox_bytes: int = 8 * 1024 * 1024,
                 max_buffer_bytes: int = 8 * 1024 * 1024, block_timeout: float | None = 60.0,
                 health_check_interval: float = 0, socket_connect_timeout: float = 5.0,
                 subscribe_timeout: float | None = 10.0, socket_timeout: float | None = None,
                 client_name: str | None = None, retry: object = None, retry_on_timeout: bool = False,
                 retry_on_error: list | None = None, socket_keepalive: bool | None = None,
                 **redis_kwargs: Unpack[RedisKeywords]) -> None:
        compat = redis_options(dict(redis_kwargs), type(self).__name__)
        if "endpoint" in compat:                     # unix_socket_path
            if endpoint is not None:
                raise ValueError(f"an endpoint given twice: endpoint={endpoint!r} and "
                                 f"unix_socket_path={redis_kwargs['unix_socket_path']!r}")
            endpoint = compat["endpoint"]
        if health_check_interval:
            # redis-py's name: how often the connection's health is checked.
            # Here every connection pings its broker every ping_interval
            # seconds anyway; a health_check_interval sets that period.
            ping_interval = health_check_interval
        if socket_timeout is not None:
            subscribe_timeout = socket_timeout
        if client_name is not None:
            if name is not None and name != client_name:
                raise ValueError(f"name={name!r} and client_name={client_name!r}: give one (they are the same setting)")
            name = client_name
        if isinstance(host, str) and "://" in host:
            # Client("tcp://127.0.0.1:6464"): an endpoint where redis-py has its
            # host; or a redis:// or unix:// URL without options (from_url reads those).
            if endpoint is not None:
                raise ValueError(f"an endpoint given twice: {host!r} and endpoint={endpoint!r}")
            if port != P.DEFAULT_PORT:
                raise ValueError(f"the endpoint {host!r} has its port: give no port={port!r}")
            endpoint, url_kw = _from_url(host)
            if set(url_kw) - {"db"}:
                raise ValueError(f"{host!r} carries options ({', '.join(sorted(url_kw))}): "
                                 f"{type(self).__name__}.from_url(url) reads them")
        options = ClientOptions(
            endpoint=endpoint or f"tcp://{host}:{int(port)}", name=name or "", decode_responses=decode_responses,
            max_messages=max_messages, max_bytes=max_bytes, max_delay=max_delay,
            max_buffer_bytes=max_buffer_bytes, block_timeout=block_timeout, max_inbox_bytes=max_inbox_bytes,
            socket_connect_timeout=socket_connect_timeout, subscribe_timeout=subscribe_timeout,
            ping_interval=ping_interval, curve_server_key=curve_server_key,
            curve_public_key=curve_public_key, curve_secret_key=curve_secret_key)
        self._start(options, context)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Self:
        """A client of the broker a URL names, as ``redis.Redis.from_url``
        reads it: ``redis://[[user]:password@]host[:port][/db][?option=value]``
        (port 6379 if none, as the scheme says: a broker bound there with
        ``--bind tcp://0.0.0.0:6379``), ``unix:///path`` (the broker's
        ``ipc:///path``), or a fastbus endpoint (``tcp://127.0.0.1:6464``).
        The URL's options (``socket_timeout``, ``decode_responses``, ...)
        win over ``kwargs``, as in redis-py; ``rediss://`` is refused (no
        TLS: CURVE encrypts).  InvalidURL for what it cannot read."""
        endpoint, from_url_kw = _from_url(url)
        return cls(endpoint=endpoint, **{**kwargs, **from_url_kw})

    @classmethod
    def from_options(cls, options: ClientOptions, context: zmq.Context | None = None) -> Client:
        """A client with the settings of ``options`` (another client's
        ``options``, or ``dataclasses.replace()`` of them)."""
        self = cls.__new__(cls)
        self._start(options, context)
        return self

    def _start(self, options: ClientOptions, context: zmq.Context | None) -> None:
        self._closed = True               # (until started: __del__ has nothing to stop)
        self._options = options
        self._conns = conns = Connections(options, context, driven_by_loop=self.driven_by_loop)
        self._outbox = Outbox(max_messages=options.max_messages, max_bytes=options.max_bytes, max_delay=None)
        gap, limit = self._burst_rule()
        self._publisher = Publisher(self._outbox, conns.keeper.wake, burst_gap=gap, burst_limit=limit,
                                    max_buffer_bytes=options.max_buffer_bytes, block_timeout=options.block_timeout,
                                    block_reason=lambda: self._pub.block_reason(), closed_error=ConnectionClosed)
        self._pub = PubSession(conns, self._publisher)
        self._publisher.send_now = self._pub.send_now
        conns.open(self._pub)
        conns.start()
        self._inbox: Inbox | None = None     # request()'s replies (made by the first request)
        self._inbox_lock = threading.Lock()
        self._closed = False
        self._tracing = tracing.producer()   # (None without OpenTelemetry configured: nothing more per message)
        if self._tracing is not None and not self.driven_by_loop:
            base_many = ClientBase.publish_many.__get__(self)
            self.publish = self._tracing.wrap(ClientBase.publish.__get__(self))
            self.publish_many = lambda messages: base_many(self._tracing.items(messages))

    @property
    def options(self) -> ClientOptions:
        """The settings this client was made with (read-only; see
        :class:`ClientOptions`)."""
        return self._options

    # The settings users read as attributes, from the options.
    endpoint = property(lambda self: self._options.endpoint, doc="The broker's address.")
    name = property(lambda self: self._options.name, doc="This client's name (the broker's views show it).")
    decode_responses = property(lambda self: self._options.decode_responses,
                                doc="Are channels and payloads returned as str?")
    max_delay = property(lambda self: self._options.max_delay, doc="The linger for batches (None: none).")
    max_inbox_bytes = property(lambda self: self._options.max_inbox_bytes,
                               doc="How much a PubSub takes in while nobody reads it.")
    socket_connect_timeout = property(lambda self: self._options.socket_connect_timeout,
                                      doc="How long subscribe() waits for a broker to answer at all.")
    subscribe_timeout = property(lambda self: self._options.subscribe_timeout,
                                 doc="How long subscribe() waits for the broker's confirmation.")

    def _burst_rule(self) -> tuple[float, int]:
        """(burst_gap, burst_limit) of the publisher (see Publisher): driven
        by a loop, a starting batch is always handed to send_now (it leaves
        when the running task yields: the loop's turn is the batch); with a
        linger, one batch per linger; else bursts as BURST_GAP/BURST_LIMIT."""
        if self.driven_by_loop:
            return 0.0, 1
        max_delay = self._options.max_delay
        return (max_delay, 1) if max_delay else (BURST_GAP, BURST_LIMIT)

    # -- publishing --------------------------------------------------------

    # publish() and publish_many() are ClientBase's (fastbus/_publisher.pyx):
    # methods in C, so a message costs one call into C and no Python frame.

    def request(self, channel: ChannelT, data: EncodableT, timeout: float = 1.0,
                headers: Mapping[str, str | bytes] | None = None) -> PubSubMessage:
        """Publish a request and return the first reply, as a message dict
        (``reply["data"]``; ``reply["headers"]`` if the responder gave
        some).  A subscriber of ``channel`` gets the request as a message
        with a ``reply_to`` and answers with ``message.respond(data)`` (or
        ``client.publish(message["reply_to"], data)``).

        :class:`~fastbus.NoResponders` at once when nobody subscribes to
        ``channel`` (this client's filter, or the broker, knows it reached
        nobody); :class:`~fastbus.RequestTimeout` if no reply comes within
        ``timeout`` seconds.  Replies come on this client's inbox,
        subscribed once by the first request (a second connection);
        requests from many threads at once are matched to their replies by
        id, in C.  Later replies to the same request are dropped."""
        return self._ask(channel, data, timeout, headers, None)

    def _ask(self, channel: ChannelT, data: EncodableT, timeout: float,
             headers: Mapping[str, str | bytes] | None, hold: int | None) -> Any:
        """A request (``hold``: to a held group, answered by the broker) and
        its answer: the reply (request()) or held_outcome's (enqueue())."""
        if self._closed:
            raise ConnectionClosed("client is closed")
        inbox = self._inbox or self._open_inbox()
        rid = inbox.replies.open()
        try:
            if not self._send_request(self._publisher, channel, data, inbox.reply_channel(rid), headers, hold):
                raise NoResponders(channel)
        except BaseException:
            inbox.replies.close(rid)
            raise
        return inbox.wait(channel, rid, timeout, None if hold is None else inbox.held_outcome)

    # -- held groups: work queues that outlive their workers ----------------

    def hold(self, channel: ChannelT, queue: str | bytes, expiry: float = 60.0) -> None:
        """Declare ``channel``'s queue group ``queue`` held on the broker:
        what :meth:`enqueue` sends it while no member can take it waits
        there, oldest first, for a member (``subscribe(channel,
        queue=queue)``) to come; the first to join gets it.  What waited
        ``expiry`` seconds is dropped (counted: ``drops.held_expired``), and
        the declaration itself lasts ``expiry`` seconds past the group's
        last member and message (declare again to renew it).  Returns once
        in effect for every publisher; :class:`~fastbus.HoldRefused` past
        the broker's ``max_held_groups``.  A held group lives on the broker
        this client is connected to (it is not announced to others)."""
        self._hold(channel, queue, expiry, False)

    def release(self, channel: ChannelT, queue: str | bytes) -> None:
        """The group :meth:`hold` declared is no longer held: what it keeps
        is dropped (the broker counts it: ``held_purged``), and it goes
        with its last member.  Returns once in effect."""
        self._hold(channel, queue, 1.0, True)

    def bind(self, source: ChannelT, channel: ChannelT, queue: str | bytes, life: float = 86400.0,
             capacity: int = 0) -> None:
        """Bind channel ``source`` to ``channel``'s held group ``queue``
        (declared with :meth:`hold` first): what is published on
        ``source`` goes to the group too, as if it had been published on
        ``channel`` (one member gets it, with ``channel`` as its channel,
        or the group keeps it while none can take it), while plain
        subscribers of ``source`` still get it as ever.  Of what comes so,
        the group keeps at most ``capacity`` while nobody takes it (0: no
        count bound but the broker's ``max_held_bytes``).  The binding
        lasts ``life`` seconds (at most a day; bind again to renew it) and
        keeps the group as long, as its declaration does; it lives on this
        client's broker, in its journal if it has one.  This is how a
        Channels layer's named channel joins a group.  Returns once in
        effect for every publisher; :class:`~fastbus.HoldRefused` if the
        group is not held, or past the broker's bounds."""
        self._hold_op(lambda inbox: inbox.bind_nowait(source, channel, queue, life, capacity))

    def unbind(self, source: ChannelT, channel: ChannelT, queue: str | bytes) -> None:
        """End :meth:`bind`'s binding (what the group kept stays in it).
        Returns once in effect."""
        self._hold_op(lambda inbox: inbox.bind_nowait(source, channel, queue, 1.0, 0, True))

    def _hold(self, channel: ChannelT, queue: str | bytes, expiry: float, release: bool) -> None:
        self._hold_op(lambda inbox: inbox.hold_nowait(channel, queue, expiry, release))

    def _hold_op(self, send: Any) -> None:
        if self._closed:
            raise ConnectionClosed("client is closed")
        inbox = self._inbox or self._open_inbox()
        seq = send(inbox)
        try:
            inbox.wait_confirmed(seq)
        finally:
            inbox.hold_outcome(seq)

    def enqueue(self, channel: ChannelT, data: EncodableT, capacity: int = 0, timeout: float = 1.0,
                headers: Mapping[str, str | bytes] | None = None) -> bool:
        """Send ``data`` to ``channel``, answered by the broker: True once a
        member of its held group (or any subscriber) has it, False if the
        group keeps it for a member to come (:meth:`hold`).
        :class:`~fastbus.QueueFull` if the group keeps ``capacity`` messages
        already (0: no count bound) or the broker's ``max_held_bytes`` is
        reached: nothing was sent.  :class:`~fastbus.NoResponders` if
        nothing wants the channel and no group keeps it (not declared, or
        its declaration expired: hold() again).  One round trip."""
        return bool(self._ask(channel, data, timeout, headers, capacity))

    def _send_request(self, publisher: Publisher, channel: ChannelT, data: EncodableT, reply_to: bytes,
                      headers: Mapping[str, str | bytes] | None, hold: int | None = None) -> int:
        """Publish a request (``hold``: to a held group, its capacity);
        with OpenTelemetry configured, in a PRODUCER span whose context its
        headers carry (as publish())."""
        if self._tracing is None:
            return publisher.publish_request(channel, data, reply_to, headers, hold)
        with self._tracing.span(channel, data):
            return publisher.publish_request(channel, data, reply_to, self._tracing.headers(headers), hold)

    def _open_inbox(self) -> Inbox:
        with self._inbox_lock:
            if self._inbox is None:
                inbox = Inbox(self._conns)
                inbox.responder = self
                self._inbox = inbox
            return self._inbox

    def ping(self, timeout: float | None = 10.0) -> bool:
        """As redis-py's: True once the broker answered a round trip (the
        one flush() makes: what this client queued is sent first).  The
        errors of flush(): FlushTimeout, BrokerUnavailable, ..."""
        self.flush(timeout)
        return True

    def is_wanted(self, channel: ChannelT, timeout: float = LEASE_WAIT) -> bool:
        """Does any subscriber want this channel, as the broker last said?
        True until the broker has told this client what its subscribers
        want, then whether anyone does.  The broker's word holds under its
        filter lease (see publish()): when that ran out (a client that
        published nothing for a tenth of a second), this asks for a new
        one and waits for it up to ``timeout`` seconds (a round trip; the
        asyncio client does not wait: True until it comes), True if none
        came."""
        s = self._pub
        if not s.filtering():
            publisher = self._publisher
            if self.driven_by_loop or not publisher.has_view or timeout <= 0:
                return True
            deadline = time.monotonic() + timeout
            while not publisher.filters():            # (whoever reads the connection applies the lease)
                if time.monotonic() >= deadline:
                    return True
                time.sleep(0.0005)
        return self._publisher.view_matches(to_key(channel)) is not False

    def flush(self, timeout: float | None = 10.0) -> None:
        """Send everything queued and wait until the broker has it (a ping
        that follows the batches comes back).  FlushTimeout (a TimeoutError)
        if it does not within ``timeout`` seconds (the messages stay queued
        for sending); BrokerUnavailable (also a TimeoutError) sooner, after
        about a second, if this client never reached its broker and nothing
        listens at its address; MessagesRejected if the broker dropped
        messages of this client since the last flush (over its size limits,
        which publish() checks itself once the broker has said them)."""
        if self._closed:
            raise ConnectionClosed("client is closed")
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        s = self._pub
        probe = None if timeout is None else AbsenceProbe(self.endpoint, start)
        with driving([s], deadline) as held:
            if held:
                f = s.start_flush()
                while not s.flush_step(f):
                    if deadline is not None and time.monotonic() >= deadline:
                        break
                    if probe is not None:
                        probe.check_handshake(s)
                        probe.check(s, self._publisher.queued)
                    s.wait(deadline if probe is None else probe.wake_by(s, deadline))
                    s.read()
                else:
                    notice = s.take_notice()
                    if notice is not None:
                        raise notice
                    return
        queued = self._publisher.queued
        raise FlushTimeout(f"the broker at {self.endpoint} did not confirm the flush within {timeout:g} s "
                           f"({queued} message(s) stay queued for it)", queued)

    # -- subscribing -------------------------------------------------------

    def pubsub(self, ignore_subscribe_messages: bool = False, durable: str | None = None) -> PubSub:
        """A new subscriber with its own connection.

        ``durable="name"``: a durable subscriber, whose session outlives
        this process.  A process that presents the same name later (killed
        and restarted, or closed and started again; within the broker's
        ``--durable-linger``, an hour by default) resumes where this one
        stopped taking messages: its subscriptions are held, and what was
        published meanwhile waits for it (within ``--max-queue-bytes``; past
        it, a ``gap`` message with the exact count).  What this process had
        read and not yet returned to the application comes again.  While a
        process holds the name, another that presents it gets
        :class:`~fastbus.DurableNameInUse` from its calls."""
        if self._closed:
            raise ConnectionClosed("client is closed")
        ps = PubSub(self._conns, ignore_subscribe_messages=ignore_subscribe_messages, durable=durable)
        ps.responder = self                      # (a received request's respond() publishes here)
        return ps

    # -- information -------------------------------------------------------

    def stats(self) -> ClientStats:
        """This client's counters: published, filtered (not sent: nobody
        wanted them), queued, rejected (the broker dropped them: over its
        limits; flush() raises MessagesRejected for them)."""
        pub = self._publisher
        return {"published": pub.accepted, "filtered": pub.refused,
                "queued": pub.queued, "queued_bytes": pub.buffered_bytes,
                "filter_active": self._pub.filtering(), "flow_paused": self._pub.flow_paused,
                "flow_pauses": self._pub.flow_pauses, "rejected": self._pub.rejected,
                "unfiltered": pub.lapsed, "unacknowledged_lost": self._pub.unacknowledged_lost}

    def broker_stats(self, timeout: float = 5.0) -> dict[str, Any]:
        """The broker's counters (see ``fastbus stats``)."""
        if self._closed:
            raise ConnectionClosed("client is closed")
        deadline = time.monotonic() + timeout
        s = self._pub
        with driving([s], deadline) as held:
            if held:
                s.stats_replies.clear()
                s.send([P.STATS])
                while time.monotonic() < deadline:
                    s.read()
                    if s.stats_replies:
                        return s.stats_replies.pop(0)
                    s.wait(deadline)
        raise BrokerTimeout(f"no answer from the broker at {self.endpoint} within {timeout:g} s", self.endpoint)

    # -- hooks for the asyncio twin (fastbus.aio) and other drivers -----------

    @property
    def closed(self) -> bool:
        """Has close() (or shutdown()) run?"""
        return self._closed

    @property
    def connections(self) -> Connections:
        """The owner of this client's connections (options, context,
        keeper); a PubSub is made on it.  Not needed by applications."""
        return self._conns

    @property
    def session(self) -> PubSession:
        """The connection this client publishes on.  Its ``fd``, ``lock``,
        ``serve()`` and ``due_in()`` let an event loop drive it instead of the
        keeper thread (as :mod:`fastbus.aio` does); ``publisher`` is its
        C publisher.  Not needed by applications."""
        return self._pub

    # -- lifecycle ---------------------------------------------------------

    def close(self, timeout: float | None = None) -> int:
        """Flush, then close every connection of this client, its PubSubs
        included.

        Without ``timeout`` it waits up to CLOSE_TIMEOUT (5 s) for the
        broker to take everything, and raises FlushTimeout naming how many
        messages it could not deliver (its connections are closed all the
        same).  With ``timeout`` the caller lets go what the broker has not
        taken by then: close() returns how many messages that was (0: the
        broker took them all)."""
        if self._closed:
            return 0
        wait = CLOSE_TIMEOUT if timeout is None else timeout
        failure: Exception | None = None
        try:
            self.flush(wait)
        except (TimeoutError, ConnectionClosed, KeyRefused, MessagesRejected) as exc:
            failure = exc
        undelivered = self._undelivered() if failure is not None else 0
        self.shutdown(wait)
        return self._closed_with(failure, undelivered, timeout is None)

    def _undelivered(self) -> int:
        """Messages the broker has not taken: queued here, or sent on the
        connection and not acknowledged (its TOOK)."""
        n = self._publisher.queued
        s = self._pub
        # Waits for the lock (a background reader may hold it for a turn):
        # a count taken without it would say 0 for what was in flight.
        if s.hold(timeout=2.0):
            try:
                if s.sock is not None and hasattr(s.sock, "unacknowledged_records"):
                    n += s.sock.unacknowledged_records(P.PUB)
            finally:
                s.release()
        return n

    def _closed_with(self, failure: Exception | None, undelivered: int, raising: bool) -> int:
        """What close() says once closed: the count, or FlushTimeout."""
        if failure is None:
            return 0
        if isinstance(failure, MessagesRejected):
            # Dropped by the broker, or never acknowledged by one that lost
            # the session: gone already, said as the flush said it.
            if not raising:
                log.warning("closed %s: %s", self.name, failure)
                return failure.count + undelivered
            raise failure
        tracked = hasattr(self._pub.sock, "unacknowledged_records") or self._pub.sock is None
        if undelivered == 0 and tracked:
            return 0                              # (the broker took everything; its last answer was lost)
        what = (f"{undelivered} message(s) the broker at {self.endpoint} did not take" if tracked else
                f"messages the broker at {self.endpoint} did not confirm ({undelivered} still queued)")
        if not raising:
            log.warning("closed %s with %s: %s", self.name, what, failure)
            return undelivered
        raise FlushTimeout(f"closed {self.name} with {what}: {failure}", undelivered) from failure

    def shutdown(self, timeout: float = 5.0) -> None:
        """Close every connection of this client, its PubSubs included,
        without waiting for the broker to confirm what was sent (close() is
        flush() then this): what is queued is sent in the time left, at most
        ``timeout`` seconds."""
        if self._closed:
            return
        self._closed = True
        self._publisher.closed = True
        # The publishing connection says goodbye first: when the PubSubs'
        # subscriptions then go, the broker has no WANT to send it (sent to
        # a connection already closed, it counted a peer lost).
        s = self._pub
        s.close_within(timeout, lambda: s.close_final(timeout))
        self._conns.shutdown(timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        close_leaving(self.close, exc_type is not None)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self._conns.stop_keeper()
            except Exception:
                pass
