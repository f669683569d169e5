"""The broker's C data plane (fastbus.broker._relay) on real ZeroMQ sockets.

The relay routes a known session's PUB and sends each link's batch in C,
queueing what a full pipe will not take under the slow-consumer policy;
every other message it hands back to the Python broker, and what Python
must act on it reports as events.  These tests drive it directly with a
ROUTER socket and DEALER peers on loopback.
"""

from __future__ import annotations

import sys
import time

import pytest
import zmq

import fastbus
from fastbus import protocol as P
from fastbus._core import Router, Trie
from fastbus import _libzmq

relay_mod = pytest.importorskip("fastbus.broker._relay")


def test_libzmq_functions_are_found_where_pyzmq_bundles_them():
    addresses = _libzmq.functions(relay_mod.FUNCTIONS)
    if addresses is None:
        assert not sys.platform.startswith("linux"), "pyzmq's libzmq not found on Linux"
        pytest.skip(f"pyzmq's libzmq not found on {sys.platform}: the broker cannot start there")
    assert set(addresses) == set(relay_mod.FUNCTIONS) and all(addresses.values())


def _relay_on_a_router(**router_options) -> tuple:
    """A fresh context, a ROUTER socket bound to a loopback port, and a
    Relay over it: ``(ctx, sock, port, trie, router, relay)``."""
    addresses = _libzmq.functions(relay_mod.FUNCTIONS)
    if addresses is None:
        pytest.skip("pyzmq's libzmq not found: no C data plane here")
    relay_mod.bind(addresses)
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.router_mandatory = 1
    r.sndhwm = 16
    port = r.bind_to_random_port("tcp://127.0.0.1")
    trie = Trie()
    router = Router(trie, **{"max_messages": 100, "max_bytes": 1 << 16, "max_payload": 1000, **router_options})
    return ctx, r, port, trie, router, relay_mod.Relay(router, r)


@pytest.fixture(params=[0.0])
def setup(request):
    ctx, r, port, trie, router, relay = _relay_on_a_router(max_delay=request.param)
    peers = []

    def peer(name: bytes):
        s = ctx.socket(zmq.DEALER)
        s.identity = name
        s.connect(f"tcp://127.0.0.1:{port}")
        s.send(b"hi")
        assert r.poll(5000)
        assert r.recv_multipart() == [name, b"hi"]
        peers.append(s)
        return s

    yield r, trie, router, relay, peer
    for s in peers:
        s.close(linger=0)
    r.close(linger=0)
    ctx.term()


def _read_all(relay, want: int = 1, timeout: float = 5.0) -> list:
    """What the relay hands back, reading until ``want`` messages came."""
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        frames, _meta, _n = relay.receive(64)
        if frames is None:
            time.sleep(0.001)
        else:
            out.append(frames)
    return out


def _wait_routed(relay, n: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while relay.batches_in < n and time.monotonic() < deadline:
        frames, _meta, _n = relay.receive(64)
        assert frames is None, frames
        time.sleep(0.001)
    assert relay.batches_in == n


def test_a_sessions_pub_is_routed_and_sent_in_c(setup):
    r, trie, router, relay, peer = setup
    pub, sub = peer(b"pub"), peer(b"sub")
    router.add_link(1)
    router.add_link(2)
    relay.add_session(1, b"pub")
    relay.add_session(2, b"sub", seq=7)
    trie.add(b"news", 2)
    batch = bytes(fastbus.encode([(b"news", b"a"), (b"other", b"b"), (b"news", b"c")]))
    pub.send_multipart([P.PUB, batch])
    _wait_routed(relay, 1)
    relay.flush()
    assert relay.blocked == 0 and relay.events() == []    # everything went out at once
    assert sub.poll(5000)
    cmd, seq, data = sub.recv_multipart()
    assert cmd == P.DATA and P.unpack_u64(seq) == 7
    assert fastbus.decode(data) == [(b"news", b"a"), (b"news", b"c")]
    assert (relay.messages_in, relay.batches_out, relay.messages_out) == (3, 1, 2)
    relay.confirm(2, 9)                                   # a later SUB: the next DATA carries its seq
    pub.send_multipart([P.PUB, batch])
    _wait_routed(relay, 2)
    relay.flush()
    assert sub.poll(5000) and P.unpack_u64(sub.recv_multipart()[1]) == 9
    # What Python routes (the upstream link 5's batches it read itself)
    # goes into the same books: one set of counters per link.
    relay.count_in(5, 3, 100)
    books = relay.link_counters()
    assert books[5] == (1, 3, 100, 0, 0, 0)
    assert books[2][3:] == (2, 2 + 2, 2 * len(data))
    assert (relay.batches_in, relay.messages_in, relay.batches_out, relay.messages_out) == (3, 9, 2, 4)
    relay.remove_link(5)                                  # its id, given to the next link, starts at zero
    assert 5 not in relay.link_counters()


def test_what_is_not_a_known_sessions_pub_comes_back(setup):
    r, trie, router, relay, peer = setup
    known, stranger = peer(b"known"), peer(b"stranger")
    router.add_link(1)
    relay.add_session(1, b"known")
    good = bytes(fastbus.encode([(b"t", b"x")]))
    known.send_multipart([P.PING, b"tok"])
    stranger.send_multipart([P.PUB, good])                 # unknown sender: Python's (KICK, etc.)
    known.send_multipart([P.PUB, b"garbage"])              # refused by the router: its status comes back
    known.send_multipart([P.PUB, bytes(fastbus.encode([(b"t", b"x" * 2000)]))])   # over max_payload: dropped, counted
    known.send_multipart([b"x"] * 12)                      # too many frames: the first 8 come back
    known.send_multipart([P.PING, b"after"])               # and the next message is read cleanly
    got = _read_all(relay, 6)
    ident = lambda m: m.ident if isinstance(m, relay_mod.PubRouted) else m[0]   # noqa: E731
    assert [m for m in got if ident(m) == b"stranger"] == [[b"stranger", P.PUB, good]]
    got = [m for m in got if ident(m) == b"known"]         # in order per sender
    assert got[0] == [b"known", P.PING, b"tok"]
    # A known session's PUB not routed whole: a typed event, not frames.
    assert isinstance(got[1], relay_mod.PubRouted) and got[1].status < 0 and got[1].over == 0
    with pytest.raises(fastbus.BatchError):
        raise fastbus._core.error_for(got[1].status, "batch")
    assert isinstance(got[2], relay_mod.PubRouted)       # routed, one record over the limit: how many
    assert got[2].status >= 0 and got[2].over == 1
    assert got[3] == [b"known"] + [b"x"] * 7
    assert got[4] == [b"known", P.PING, b"after"]
    st = router.stats()
    assert st["rejected"] == 1 and st["oversize"] == 1 and relay.batches_in == 1


def _fill(relay, pub, sub_sock, batch: bytes, until, limit: int = 5000) -> list:
    """Publish ``batch`` until ``until(events)`` (the subscriber reads
    nothing; the relay reads on only once its events are taken): the
    events."""
    n = relay.batches_in
    events: list = []
    for _ in range(limit):
        pub.send_multipart([P.PUB, batch])
        _wait_routed(relay, n + 1)
        n += 1
        relay.flush()
        events += relay.events()
        if until(events):
            return events
    raise AssertionError(f"not reached after {limit} batches: {relay.queue_state(2)}")


@pytest.fixture
def slow(setup):
    """A publisher (link 1) and a subscriber (link 2, "news") whose pipe
    fills fast: small kernel buffers, a receive high-water mark of one."""
    r, trie, router, relay, peer = setup
    r.sndbuf = 4096
    pub = peer(b"pub")
    r.sndhwm = 2
    sub = r.context.socket(zmq.DEALER)
    sub.identity = b"sub"
    sub.rcvhwm = 1
    sub.rcvbuf = 4096
    sub.connect(r.last_endpoint.decode())
    sub.send(b"hi")
    assert r.poll(5000) and r.recv_multipart() == [b"sub", b"hi"]
    for link, name in ((1, b"pub"), (2, b"sub")):
        router.add_link(link)
        relay.add_session(link, name)
    trie.add(b"news", 2)
    yield relay, pub, sub
    sub.close(linger=0)


def _drain(relay, sub, events: list | None = None, timeout: float = 10.0, until=None) -> list:
    """Read everything the subscriber is sent while the relay retries its
    queue, until the queue is empty and nothing more comes for 100 ms (and
    ``until(got)``, if given, holds: a message the test waits for may come
    later than that under load); the relay's events are added to
    ``events``."""
    got: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert relay.wait([], 5) == []
        if events is not None:
            events += relay.events()
        if sub.poll(0):
            while sub.poll(0):
                got.append(sub.recv_multipart())
        elif relay.blocked == 0 and not sub.poll(100) and (until is None or until(got)):
            break
    return got


def test_a_full_pipe_queues_in_c_and_drains_in_order(slow):
    """What the subscriber's pipe will not take waits in its queue in the
    relay (held in the router meanwhile, so later batches grow), and goes
    out in order as it reads, control messages in their place."""
    relay, pub, sub = slow
    batch = bytes(fastbus.encode([(b"news", b"x" * 500)] * 10))
    _fill(relay, pub, sub, batch, lambda _e: relay.queue_state(2)[0] > 50_000)
    queued, blocked, holding, exempt, lost, _last = relay.queue_state(2)
    assert blocked and relay.blocked == 1 and not holding and lost == 0
    assert relay.queued_bytes == queued
    assert relay.send(2, [P.CONFIRM, P.pack_u64(5)]) == relay_mod.QUEUED     # behind the data
    sub.send_multipart([P.PING, b"sync"])                 # answered in C, behind the queue too
    relay.answer_leases(b"inst", 0.25)
    got = _drain(relay, sub, until=lambda got: bool(got) and got[-1][0] == P.PONG)   # (late under ASan)
    cmds = [m[0] for m in got]
    assert cmds[-2:] == [P.CONFIRM, P.PONG] and set(cmds[:-2]) == {P.DATA}, cmds[-5:]
    assert sum(len(fastbus.decode(m[2])) for m in got[:-2]) == 10 * relay.batches_in
    assert relay.queue_state(2)[:2] == (0, False) and relay.events() == []
    assert relay.messages_out == 10 * relay.batches_in        # the books count what went


def test_the_slow_consumer_policy_applies_in_c(slow):
    """Past max_queue_bytes the oldest data goes, counted, and GAP tells the
    subscriber before the data after the loss; past flow_bytes the queue
    holds publishers back (EVENT_FLOW), until it drains to a quarter;
    WANT and FLOW collapse into one mark each; under "disconnect" the
    session is kicked and reported (EVENT_SLOW)."""
    relay, pub, sub = slow
    relay.set_policy(200_000, 60_000, False)
    batch = bytes(fastbus.encode([(b"news", b"y" * 500)] * 10))
    events = _fill(relay, pub, sub, batch, lambda _e: relay.dropped_slow > 0)
    assert (relay_mod.EVENT_FLOW, 0, 0) in events and relay.holding == 1
    assert relay.queue_state(2)[0] <= 200_000 and relay.queue_state(2)[4] == relay.dropped_slow
    relay.paused = True                                   # (Python's set_flow)
    for flow in (P.FLOW_PAUSE, P.FLOW_RESUME, P.FLOW_PAUSE):     # one mark, sent as the state then
        assert relay.send(2, [P.FLOW, flow]) in (relay_mod.QUEUED, relay_mod.COLLAPSED)
    assert relay.control_collapsed >= 2
    events = []
    got = _drain(relay, sub, events)
    gaps = [i for i, m in enumerate(got) if m[0] == P.GAP]
    assert len(gaps) == 1 and P.unpack_u64(got[gaps[0]][1]) == relay.dropped_slow, [m[0] for m in got]
    assert [m for m in got if m[0] == P.FLOW] == [[P.FLOW, P.FLOW_PAUSE]]
    delivered = sum(len(fastbus.decode(m[2])) for m in got if m[0] == P.DATA)
    assert delivered + relay.dropped_slow == 10 * relay.batches_in and relay.gap_notices == 1
    assert relay.holding == 0 and (relay_mod.EVENT_FLOW, 0, 0) in events     # resume them
    relay.paused = False
    # Disconnect: the queue goes, a KICK says why, Python hears it.
    relay.set_policy(100_000, 0, True)
    events = _fill(relay, pub, sub, batch, lambda e: (relay_mod.EVENT_SLOW, 2, 0) in e)
    assert events == [(relay_mod.EVENT_SLOW, 2, 0)] and relay.queue_state(2)[0] == 0
    assert relay.send(2, [P.PONG, b"t", b"i"]) == relay_mod.DROPPED       # gone: nothing more goes
    got = _drain(relay, sub)                              # what its pipe held; the KICK if it had room
    kick = [P.KICK, P.dump_json({"reason": relay_mod.SLOW_REASONS[0]})]
    assert {m[0] for m in got} <= {P.DATA, P.KICK} and (kick not in got or got[-1] == kick)


def test_a_want_mark_at_the_head_asks_python_for_the_reset(slow):
    """WANT diffs that cannot go collapse into one mark; when it reaches
    the head of the queue the relay asks Python (EVENT_WANT), and the
    reset Python builds then takes its place."""
    relay, pub, sub = slow
    batch = bytes(fastbus.encode([(b"news", b"z" * 500)] * 10))
    _fill(relay, pub, sub, batch, lambda _e: relay.queue_state(2)[0] > 30_000)
    for i in range(5):
        relay.send(2, [P.WANT, b"\x00", b"diff-%d" % i])
    assert relay.control_collapsed == 5                   # all five stand in one mark
    got: list = []
    deadline = time.monotonic() + 10
    asked = []
    while not asked and time.monotonic() < deadline:
        relay.wait([], 5)
        asked = [e for e in relay.events() if e[0] == relay_mod.EVENT_WANT]
        while sub.poll(0):
            got.append(sub.recv_multipart())
    assert asked == [(relay_mod.EVENT_WANT, 2, 0)] and relay.wants_reset(2) and not relay.wants_reset(1)
    relay.fill_want(2, [P.WANT, bytes([P.WANT_RESET]), b"whole"])
    assert not relay.wants_reset(2)
    got += _drain(relay, sub, until=lambda g: any(m[0] == P.WANT for m in got + g))
    wants = [m for m in got if m[0] == P.WANT]
    assert wants == [[P.WANT, bytes([P.WANT_RESET]), b"whole"]] and got[-1] == wants[0]


def test_a_send_the_socket_refuses_for_good_is_reported(setup):
    """EHOSTUNREACH (the peer left): the batch goes, Python hears of it
    (EVENT_GONE) and nothing more is sent to the link."""
    r, trie, router, relay, peer = setup
    pub = peer(b"pub")
    for link in (1, 2):
        router.add_link(link)
    relay.add_session(1, b"pub")
    relay.add_session(2, b"gone")                         # never connected: EHOSTUNREACH
    trie.add(b"t", 2)
    pub.send_multipart([P.PUB, bytes(fastbus.encode([(b"t", b"x")]))])
    _wait_routed(relay, 1)
    relay.flush()
    assert relay.events() == [(relay_mod.EVENT_GONE, 2, 0)]
    assert relay.batches_out == 0 and relay.blocked == 0
    assert relay.send(2, [P.PONG, b"t", b"i"]) == relay_mod.DROPPED
    relay.add_session(3, b"gone-too")
    assert relay.send(3, [P.PONG, b"t", b"i"]) == relay_mod.GONE
    # A reply outside any session's queue (an unknown peer, a refused HELLO).
    assert relay.reply(b"nobody", [P.KICK, b"{}"]) is False
    assert relay.reply(b"pub", [P.KICK, b'{"reason":"hello required"}']) is True
    assert pub.poll(5000) and pub.recv_multipart() == [P.KICK, b'{"reason":"hello required"}']


def _answer(sock, relay, timeout: float = 5.0):
    """Let the relay read until ``sock`` (a peer) has an answer: (what Python
    was handed meanwhile, the answer)."""
    handed: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frames, _meta, _n = relay.receive(64)
        if frames is not None:
            handed.append(frames)
        if sock.poll(1):
            return handed, sock.recv_multipart()
    return handed, None


def test_the_upstream_brokers_batches_go_both_ways_in_c(setup):
    """A downstream broker's publishers' batches wanted upstream leave on
    its DEALER socket as [PUB, batch] from the relay, and upstream's DATA
    is routed by it, counted in the same books; Python's control
    messages go up through it; once the link is gone nothing is sent."""
    r, trie, router, relay, peer = setup
    ctx = r.context
    above = ctx.socket(zmq.ROUTER)                        # the upstream broker's socket
    dealer = ctx.socket(zmq.DEALER)
    try:
        port = above.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        pub = peer(b"pub")
        router.add_link(1)
        router.add_link(3)
        relay.add_session(1, b"pub")
        relay.set_upstream(3, dealer)
        trie.add(b"up", 3)
        batch = bytes(fastbus.encode([(b"up", b"a"), (b"other", b"b")]))
        pub.send_multipart([P.PUB, batch])
        _wait_routed(relay, 1)
        relay.flush()                                     # sent in C
        assert above.poll(5000)
        ident, cmd, data = above.recv_multipart()
        assert cmd == P.PUB and fastbus.decode(data) == [(b"up", b"a")]
        assert relay.link_counters()[3][3:] == (1, 1, len(data))
        # And down: upstream's DATA is routed in the poll, to a session
        # here; only other messages wake Python, in order, and a DATA the
        # router refuses comes to Python with the router's status.
        sub = peer(b"sub")
        router.add_link(2)
        relay.add_session(2, b"sub", seq=4)
        trie.add(b"down", 2)
        down = bytes(fastbus.encode([(b"down", b"d"), (b"nobody", b"n")]))
        above.send_multipart([ident, P.DATA, P.pack_u64(0), down])
        deadline = time.monotonic() + 5
        while not sub.poll(10) and time.monotonic() < deadline:
            assert relay.wait([dealer], 10) == []         # nothing for Python
        assert sub.recv_multipart() == [P.DATA, P.pack_u64(4), bytes(fastbus.encode([(b"down", b"d")]))]
        assert relay.link_counters()[3][:3] == (1, 2, len(down))
        above.send_multipart([ident, P.PONG, b"t", b"up-1"])
        above.send_multipart([ident, P.DATA, P.pack_u64(0), b"garbage"])
        above.send_multipart([ident, P.DATA, P.pack_u64(0), down])
        assert relay.wait([dealer], 5000) == [0]
        assert relay.take_upstream() == [P.PONG, b"t", b"up-1"] and relay.take_upstream() is None
        assert relay.wait([dealer], 5000) == [0]
        refused = relay.take_upstream()
        assert isinstance(refused, relay_mod.UpstreamRefused) and refused.status < 0
        assert relay.wait([dealer], 10) == []             # the next DATA: routed again
        assert sub.poll(5000) and sub.recv_multipart()[0] == P.DATA
        assert relay.send(3, [P.PING, b"up"]) == relay_mod.SENT   # Python's control messages go up too
        assert above.poll(5000) and above.recv_multipart() == [ident, P.PING, b"up"]
        relay.remove_link(3)                              # gone: not the relay's to send any more
        router.add_link(3)
        pub.send_multipart([P.PUB, batch])
        _wait_routed(relay, 4)
        relay.flush()
        assert not above.poll(200) and relay.send(3, [P.PING, b"x"]) == relay_mod.DROPPED
    finally:
        dealer.close(linger=0)
        above.close(linger=0)


def test_a_ping_is_answered_in_c_where_nothing_waits_ahead_of_it(setup):
    """Every client pings each ping_interval, and a session that
    acknowledges asks for a filter lease about 20 times a second: the
    relay answers [PONG, token, instance] (and the lease's µs to a lease
    ping, recording the grant: lease_end) without handing Python the PING,
    behind the DATA routed to the session before it (and behind its queue:
    test_a_full_pipe_queues_in_c_and_drains_in_order).  Python keeps it
    for an unknown peer, a lease ping from a peer that does not
    acknowledge, and while no lease was said (a broker under an upstream)."""
    r, trie, router, relay, peer = setup
    acking, plain, stranger = peer(b"acking"), peer(b"plain"), peer(b"stranger")
    router.add_link(1)
    router.add_link(2)
    relay.add_session(1, b"acking", acks=True)
    relay.add_session(2, b"plain")
    lease_ping = [P.PING, b"tok", P.LEASE_ASK]

    for frames in (lease_ping, [P.PING, b"t0"]):          # no instance said yet: Python's
        acking.send_multipart(frames)
        handed, answer = _answer(acking, relay, timeout=0.3)
        assert handed == [[b"acking", *frames]] and answer is None

    relay.answer_leases(b"instance-1", 0.25)
    t0 = time.monotonic()
    acking.send_multipart(lease_ping)
    handed, answer = _answer(acking, relay)
    assert handed == [] and answer == [P.PONG, b"tok", b"instance-1", P.pack_u64(250_000)]
    assert t0 + 0.25 <= relay.lease_end(1) <= time.monotonic() + 0.25
    assert relay.lease_end(2) == float("-inf") and relay.leases_granted == 1
    for who in (acking, plain):                           # a liveness PING, from any session
        who.send_multipart([P.PING, b"t2"])
        handed, answer = _answer(who, relay)
        assert handed == [] and answer == [P.PONG, b"t2", b"instance-1"]
    assert relay.pings_answered == 3 and relay.leases_granted == 1

    for who, frames in ((plain, lease_ping), (stranger, [P.PING, b"t3"])):
        who.send_multipart(frames)                        # no "ack" in its HELLO; not a session
        handed, answer = _answer(who, relay, timeout=0.3)
        assert handed == [[who.identity, *frames]] and answer is None
    relay.answer_leases(b"instance-1", 0)                 # Python answers lease pings again
    acking.send_multipart(lease_ping)
    handed, answer = _answer(acking, relay, timeout=0.3)
    assert handed == [[b"acking", *lease_ping]] and answer is None
    acking.send_multipart([P.PING, b"t5"])               # (liveness pings need no lease)
    handed, answer = _answer(acking, relay)
    assert handed == [] and answer == [P.PONG, b"t5", b"instance-1"]
    assert relay.leases_granted == 1 and relay.pings_answered == 4
    with pytest.raises(ValueError):
        relay.answer_leases(b"x" * 65, 0.1)
    # Python's own grants (WELCOME, the PONGs it answers) have the same
    # home: the latest end counts, as at the peer; no session, no lease.
    t0 = time.monotonic()
    relay.grant(1, 5_000_000)
    assert t0 + 5 <= relay.lease_end(1) <= time.monotonic() + 5
    end = relay.lease_end(1)
    relay.grant(1, 10)                                    # a grant that ends sooner shortens nothing
    assert relay.lease_end(1) == end
    relay.grant(3, 5_000_000)
    assert relay.lease_end(3) == float("-inf")
    relay.remove_link(1)
    assert relay.lease_end(1) == float("-inf")


@pytest.mark.parametrize("setup", [2.0], indirect=True)
def test_a_pong_comes_behind_the_data_routed_to_the_session_before_its_ping(setup):
    """A client's flush (or any ping) is answered behind what the broker
    routed to it before: with a 2 s linger, a batch right after another
    waits in the session's outbox, and the PING sends it ahead of the
    PONG."""
    r, trie, router, relay, peer = setup
    pub, sub = peer(b"pub"), peer(b"sub")
    for link, name in ((1, b"pub"), (2, b"sub")):
        router.add_link(link)
        relay.add_session(link, name)
    relay.answer_leases(b"instance-1", 0.25)
    trie.add(b"news", 2)
    pub.send_multipart([P.PUB, bytes(fastbus.encode([(b"news", b"first")]))])
    _wait_routed(relay, 1)
    assert sub.poll(5000) and sub.recv_multipart()[0] == P.DATA     # an idle link's batch goes at once
    pub.send_multipart([P.PUB, bytes(fastbus.encode([(b"news", b"second")]))])
    _wait_routed(relay, 2)
    assert not sub.poll(100)                              # the next lingers in its outbox
    sub.send_multipart([P.PING, b"sync"])
    got = []
    deadline = time.monotonic() + 1.5                     # before the linger sends it
    while len(got) < 2 and time.monotonic() < deadline:
        assert relay.wait([], 10) == []
        while sub.poll(0):
            got.append(sub.recv_multipart())
    assert [f[0] for f in got] == [P.DATA, P.PONG] and got[1] == [P.PONG, b"sync", b"instance-1"]
    assert fastbus.decode(got[0][2]) == [(b"news", b"second")]


def test_a_brokers_publishers_lease_pings_are_answered_by_its_data_plane():
    """End to end, in an embedded broker: a filtering publisher's lease
    pings (about 20 a second) are answered in C, its filter stays in effect
    (what nobody wants is not sent).  Under an upstream, whose lease bounds ours, Python
    answers them (lease_grant_us)."""
    from brokers import wait_wanted
    from fastbus.broker import Broker, BrokerConfig
    top = Broker(BrokerConfig(bind=["tcp://127.0.0.1:0"])).start()
    below = Broker(BrokerConfig(bind=["tcp://127.0.0.1:0"], upstream=top.endpoint)).start()
    try:
        for broker, in_c in ((top, True), (below, False)):
            with fastbus.Client(endpoint=broker.endpoint) as sub_client, \
                    fastbus.Client(endpoint=broker.endpoint) as pub_client:
                p = sub_client.pubsub(ignore_subscribe_messages=True)
                p.subscribe("wanted")
                wait_wanted(pub_client, "wanted")
                granted = broker.relay.leases_granted
                for _ in range(50):
                    pub_client.publish("wanted", b"w")
                    pub_client.publish("unwanted", b"u")
                    time.sleep(0.01)
                st = pub_client.stats()
                assert st["filter_active"] and st["filtered"] == 50, st
                granted = broker.relay.leases_granted - granted
                if in_c:
                    assert granted >= 5, f"{granted} lease pings answered in C in 0.5 s"
                else:
                    assert granted == 0
                got = 0
                while got < 50 and p.get_message(timeout=5) is not None:
                    got += 1
                assert got == 50
    finally:
        below.stop()
        top.stop()


def test_routing_ids_survive_churn(setup):
    """Sessions come and go (their ids are reused): every lookup stays
    right, and the table does not grow with the churn."""
    r, trie, router, relay, peer = setup
    pub = peer(b"pub")
    router.add_link(1)
    relay.add_session(1, b"pub")
    for i in range(5000):
        link = 2 + i % 7
        relay.add_session(link, b"peer-%d" % i)
        relay.remove_link(link)
    relay.add_session(2, b"peer-x")
    relay.add_session(3, b"pub")                          # the same routing id again: the new link has it
    router.add_link(3)
    pub.send_multipart([P.PUB, bytes(fastbus.encode([(b"t", b"x")]))])
    _wait_routed(relay, 1)
    assert router.stats()["batches"] == 1
    relay.remove_link(3)
    pub.send_multipart([P.PUB, bytes(fastbus.encode([(b"t", b"x")]))])
    got = _read_all(relay, 1)
    assert got[0][:2] == [b"pub", P.PUB]                   # no longer known: Python's
    with pytest.raises(ValueError):
        relay.add_session(4, b"")
    with pytest.raises(ValueError):
        relay.add_session(4, b"x" * 256)
    # Link ids are bounded (the table grows to the largest id given).
    with pytest.raises(ValueError, match="out of range"):
        relay.add_session(1 << 26, b"far")
    with pytest.raises(ValueError, match="out of range"):
        relay.count_in(1 << 26, 1, 10)
    relay.add_session(5, b"near")                              # a refused id changed nothing


def test_wait_routes_in_c_and_returns_only_for_python(setup):
    """wait() is the broker's poll: it routes and sends known sessions'
    PUBs itself, and returns when a message is Python's (receive() gives
    it first), when another socket or descriptor is readable, when
    events wait for Python, or at its timeout."""
    r, trie, router, relay, peer = setup
    pub, sub = peer(b"pub"), peer(b"sub")
    for link in (1, 2, 3):
        router.add_link(link)
    relay.add_session(1, b"pub")
    relay.add_session(2, b"sub")
    trie.add(b"news", 2)
    batch = bytes(fastbus.encode([(b"news", b"x")]))

    t0 = time.monotonic()
    assert relay.wait([], 60) == []                       # nothing: the timeout
    assert time.monotonic() - t0 >= 0.05

    # 200 PUBs, then a PING: wait() routes the PUBs and returns for the PING.
    for _ in range(200):
        pub.send_multipart([P.PUB, batch])
    pub.send_multipart([P.PING, b"t"])
    got, t0 = [], time.monotonic()
    while not got and time.monotonic() - t0 < 5:
        got = relay.wait([], 5000)
    assert got == [-1] and relay.batches_in == 200
    assert relay.wait([], 5000) == [-1]                   # still Python's until taken
    frames, _meta, _n = relay.receive(64)
    assert frames == [b"pub", P.PING, b"t"]
    delivered = 0
    while delivered < 200 and sub.poll(5000):
        delivered += len(fastbus.decode(sub.recv_multipart()[2]))
    assert delivered == 200

    # Another socket and a descriptor: their indices.
    import os
    rfd, wfd = os.pipe()
    try:
        os.write(wfd, b"!")
        assert relay.wait([sub, rfd], 5000) == [1]
    finally:
        os.close(rfd)
        os.close(wfd)

    # A batch for a link the relay cannot send to (leaving): dropped, nothing for Python.
    trie.add(b"up", 3)
    pub.send_multipart([P.PUB, bytes(fastbus.encode([(b"up", b"y")]))])
    t0 = time.monotonic()
    while relay.batches_in < 201:
        assert relay.wait([], 5000, True) == []
        assert time.monotonic() - t0 < 5

    # once=True: back after the first turn that routed anything.
    pub.send_multipart([P.PUB, batch])
    t0 = time.monotonic()
    while relay.batches_in < 202:
        assert relay.wait([], 5000, True) == []
        assert time.monotonic() - t0 < 5
    assert time.monotonic() - t0 < 4


def test_wait_raises_when_its_context_is_terminated():
    """As pyzmq's poll did for the broker's loop: a terminated context ends
    the wait with ContextTerminated (the loop then stops), never a loop
    that polls a dead socket over and over."""
    import threading
    ctx, r, _port, _trie, _router, relay = _relay_on_a_router()
    r.linger = 0
    term = threading.Thread(target=ctx.term)
    term.start()
    try:
        with pytest.raises(zmq.ContextTerminated):
            relay.wait([], 10_000)
    finally:
        r.close()
        term.join(10)
    assert not term.is_alive()


def test_wait_lets_other_python_threads_run(setup):
    """wait() holds no interpreter lock: a Python thread counts on while
    the broker's thread waits."""
    import threading
    r, trie, router, relay, peer = setup
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.05)
        before = count[0]
        relay.wait([], 300)
        assert count[0] - before > 1000
    finally:
        stop.set()
        t.join()


def test_the_broker_needs_its_data_plane(monkeypatch):
    """Where pyzmq's libzmq cannot be found the broker does not start (there
    is no second data plane to fall back on), and says why."""
    from fastbus.broker import Broker, BrokerConfig, _libzmq as broker_libzmq
    from fastbus.errors import DataPlaneUnavailable
    monkeypatch.setattr(broker_libzmq, "_bound", False)
    monkeypatch.setattr(broker_libzmq, "functions", lambda names: None)
    with pytest.raises(DataPlaneUnavailable, match="pyzmq"):
        Broker(BrokerConfig(bind=["tcp://127.0.0.1:0"])).start()
