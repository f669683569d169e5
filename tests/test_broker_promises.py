"""What the broker promises a client, and what one client may cost it:
refused subscriptions are never confirmed, oversized messages are dropped
alone and reported, a restart is one notice, only allowed peers are
brokers, and a subscription frame cannot make the broker work or grow
without bound.  Real brokers in subprocesses, on loopback."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import zmq
from brokers import collect, confirm, expect_kick, raw_dealer, wait_for, wait_wanted

import fastbus
from fastbus import protocol as P
from fastbus._core import SUBSCRIBE


def _messages(p, n: int, timeout: float = 10.0) -> list:
    """The next n messages of any type."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        m = p.get_message(timeout=0.2)
        if m is not None:
            out.append(m)
    return out


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _hello(s: zmq.Socket, role: str = "client", pub: bool = False) -> dict:
    s.send_multipart([P.HELLO, P.dump_json({"v": P.VERSION, "role": role, "pub": pub, "name": "raw"})])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if s.poll(1000):
            frames = s.recv_multipart()
            if frames[0] == P.WELCOME:
                return json.loads(frames[1])
            if frames[0] == P.KICK:
                return {"kick": json.loads(frames[1])}
    raise AssertionError("no WELCOME or KICK")


def _replies(s: zmq.Socket, want: bytes, timeout: float = 10.0) -> list:
    """Messages until one whose command is ``want`` (included)."""
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if s.poll(500):
            frames = s.recv_multipart()
            out.append(frames)
            if frames[0] == want:
                return out
    raise AssertionError(f"no {want!r} in {[f[0] for f in out]}")


# -- refused subscriptions are never confirmed -----------------------------------

def test_subscriptions_over_the_limit_are_refused_not_confirmed(brokers):
    b = brokers("--max-subscriptions", "100")
    with fastbus.Client(endpoint=b.endpoint) as sub, fastbus.Client(endpoint=b.endpoint) as pub:
        p = sub.pubsub()
        chans = [f"c{i}" for i in range(150)]
        p.subscribe(*chans)
        msgs = _messages(p, 150)
        kinds = [m["type"] for m in msgs]
        assert kinds.count("subscribe") == 100 and kinds.count("refused") == 50
        assert [m["data"] for m in msgs if m["type"] == "subscribe"] == list(range(1, 101))
        refused = [m for m in msgs if m["type"] == "refused"]
        assert b"too many subscriptions" in refused[0]["data"] and b"max_subscriptions" in refused[0]["data"]
        assert len(p.channels) == 100 and all(m["channel"] not in p.channels for m in refused)
        held = [m["channel"] for m in msgs if m["type"] == "subscribe"]
        wait_wanted(pub, *held[:3])
        for ch in chans:
            pub.publish(ch, ch.encode())
        pub.flush()
        got = {m["channel"] for m in collect(p, 150, timeout=3)}
        assert got == set(held)                   # a refused channel never receives, and says so above
        assert b.stats()["drops"]["too_many_subscriptions"] == 50


def test_subscription_bytes_are_budgeted_per_connection_and_in_all(brokers):
    b = brokers("--max-subscription-bytes", str(20 * (1000 + 48)), "--max-total-subscription-bytes",
                str(30 * (1000 + 48)))
    with fastbus.Client(endpoint=b.endpoint) as c1, fastbus.Client(endpoint=b.endpoint) as c2:
        p1, p2 = c1.pubsub(), c2.pubsub()
        p1.subscribe(*[f"{i:04d}".ljust(1000, "x") for i in range(25)])
        m1 = _messages(p1, 25)
        assert [m["type"] for m in m1].count("subscribe") == 20
        assert b"max_subscription_bytes" in next(m for m in m1 if m["type"] == "refused")["data"]
        p2.subscribe(*[f"{i:04d}".ljust(1000, "y") for i in range(15)])
        m2 = _messages(p2, 15)
        assert [m["type"] for m in m2].count("subscribe") == 10          # the broker-wide budget
        assert b"max_total_subscription_bytes" in next(m for m in m2 if m["type"] == "refused")["data"]
        p1.unsubscribe()                                                  # gives its bytes back
        _messages(p1, 20)
        p2.subscribe("small")
        assert _messages(p2, 1)[0]["type"] == "subscribe"


def test_a_huge_subscription_frame_is_refused_at_once_without_growing_the_broker(brokers):
    """One SUB frame of 16 MiB of 3-byte operations: refused whole (KICK,
    with the limit in the reason) before anything is built from it."""
    b = brokers()
    rss0 = _rss_kb(b.proc.pid)
    s = raw_dealer(b.endpoint)
    _hello(s)
    n = (16 << 20) // 3
    ops = P.encode_ops((SUBSCRIBE, b"%03d" % (i % 1000), False) for i in range(n))
    t0 = time.monotonic()
    s.send_multipart([P.SUB, P.pack_u64(1), ops])
    reason = expect_kick(s)
    assert time.monotonic() - t0 < 5
    assert "limit" in reason or "records" in reason, reason
    assert _rss_kb(b.proc.pid) - rss0 < 150_000                           # KiB; the frame itself is 16 MiB
    # Others were served meanwhile, and large changes from a client are split.
    with fastbus.Client(endpoint=b.endpoint) as c:
        p = c.pubsub(ignore_subscribe_messages=True)
        p.subscribe(*[f"k{i}" for i in range(20_000)])                    # over max_sub_ops: several frames
        wait_for(lambda: b.stats()["subscriptions"] == 20_000, what="20,000 subscriptions applied")
    s.close()


# -- oversized messages --------------------------------------------------------------

def test_an_oversized_message_is_dropped_alone_and_the_sender_told(brokers):
    b = brokers("--max-payload", "1000")
    with fastbus.Client(endpoint=b.endpoint) as sub:
        p = sub.pubsub()
        p.subscribe("t")
        confirm(p, 1)
        s = raw_dealer(b.endpoint)
        welcome = _hello(s, pub=True)
        assert welcome["limits"]["max_payload"] == 1000                   # the client learns the limits
        records = [(b"t", b"%d" % i) for i in range(20)]
        records.insert(7, (b"t", b"x" * 2000))
        s.send_multipart([P.PUB, bytes(fastbus.encode(records))])
        notice = _replies(s, P.NOTICE)[-1]
        info = json.loads(notice[1])
        assert info["dropped"] == 1 and "max_payload" in info["reason"]
        assert [m["data"] for m in collect(p, 20)] == [b"%d" % i for i in range(20)]   # the 20 arrive
        st = b.stats()
        assert st["drops"]["oversize"] == 1 and st["peers"] == 3          # nobody was dropped (2 + raw)
        s.close()


def test_a_client_refuses_an_oversized_message_or_reports_it(brokers):
    """publish() knows the broker's limits from WELCOME and refuses with
    ValueError; a message sent before it knew is reported by flush()."""
    b = brokers("--max-payload", "1000")
    with fastbus.Client(endpoint=b.endpoint) as c:
        try:
            c.publish("t", b"x" * 2000)              # before WELCOME: sent, and flush() reports it
            refused_here = False
        except ValueError:
            refused_here = True                      # WELCOME came first: refused at once
        try:
            c.flush()
            reported = False
        except fastbus.MessagesRejected as exc:
            reported = exc.count == 1
        assert refused_here != reported              # one or the other, never silence
        assert b.stats()["drops"]["oversize"] == (1 if reported else 0)
        wait_for(lambda: c._publisher.max_payload == 1000, what="the broker's limits")
        with pytest.raises(fastbus.MessageTooLarge, match="max_payload") as too_large:
            c.publish("t", b"x" * 2000)
        assert isinstance(too_large.value, ValueError)          # as before it had a class of its own
        assert (too_large.value.what, too_large.value.size, too_large.value.limit) == ("payload", 2000, 1000)
        with pytest.raises(fastbus.MessageTooLarge, match="max_payload"):
            c.publish_many([("t", b"ok"), ("t", b"x" * 2000)])      # checked before any is queued
        assert c.publish("t", b"x" * 1000) in (0, 1)
        c.flush()


def test_a_message_no_frame_can_carry_is_refused_before_welcome_and_the_broker_says_its_bound(brokers, tmp_path):
    """Before any WELCOME a client refuses what no broker's frame carries
    (it would close the connection: the message, and what followed it,
    gone without a word); a broker does not start with a --max-payload its
    frames cannot carry."""
    import subprocess
    import sys
    with fastbus.Client(endpoint="tcp://127.0.0.1:1") as c:       # nobody there: no WELCOME ever
        with pytest.raises(fastbus.MessageTooLarge, match="max_payload") as too_large:
            c.publish("t", b"x" * (100 << 20))
        assert too_large.value.limit == P.MAX_PAYLOAD_UNWELCOMED
        assert c.stats()["published"] == 0
    r = subprocess.run([sys.executable, "-m", "fastbus", "broker", "--max-payload", str(100 << 20),
                        "--bind", "tcp://127.0.0.1:0"], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "max_message_bytes" in r.stderr and "at most" in r.stderr


def test_a_truncated_batch_is_counted_once(brokers):
    b = brokers()
    s = raw_dealer(b.endpoint)
    _hello(s, pub=True)
    good = bytes(fastbus.encode([(b"t", b"x" * 10)] * 5))
    s.send_multipart([P.PUB, good[:-3]])
    assert "protocol error" in expect_kick(s)
    assert b.stats()["drops"]["malformed"] == 1
    s.close()


# -- reconnects and closing ------------------------------------------------------------

def test_a_broker_restart_is_one_reconnect_notice(brokers):
    b = brokers()
    with fastbus.Client(endpoint=b.endpoint) as c:
        p = c.pubsub()
        p.subscribe("r")
        confirm(p, 1)
        b.kill()
        # Said at once, while the broker is down (the native reader saw the
        # connection go), not when it is back.
        m = p.get_message(timeout=2)
        assert m is not None and m["type"] == "disconnected", m
        assert b"was lost" in m["data"]
        b.start()
        notices = [m for m in _messages(p, 3, timeout=6) if m["type"] == "reconnect"]
        assert len(notices) == 1, notices
        assert b"restarted" in notices[0]["data"] and b"not delivered" in notices[0]["data"]
        with fastbus.Client(endpoint=b.endpoint) as pub:
            wait_wanted(pub, "r")
            pub.publish("r", b"again")
            pub.flush()
        assert [m["data"] for m in collect(p, 1)] == [b"again"]


def test_more_subscriptions_than_one_frame_takes_survive_a_restart(brokers):
    """The resend after a restart is split as subscribe() splits, at the
    limit the restarted broker announces (here lower than before): one
    frame past it would be a protocol error, the session dropped, and the
    resend refused again, for ever."""
    b = brokers("--max-sub-ops", "2000")
    channels = [f"many.{i}" for i in range(2500)]
    with fastbus.Client(endpoint=b.endpoint) as c:
        p = c.pubsub(ignore_subscribe_messages=True)
        p.subscribe(*channels)
        wait_for(lambda: b.stats()["subscriptions"] == 2500, what="2,500 subscriptions held")
        b.kill()
        b.args = [a if a != "2000" else "1000" for a in b.args]
        b.start()
        wait_for(lambda: b.stats()["subscriptions"] == 2500, what="2,500 subscriptions resent")
        notices = [m for m in _messages(p, 5, timeout=2) if m["type"] == "reconnect"]
        assert len(notices) == 1, notices
        assert b.stats()["drops"]["protocol"] == 0
        with fastbus.Client(endpoint=b.endpoint) as pub:
            wait_wanted(pub, channels[0], channels[-1])
            pub.publish(channels[-1], b"last")
            pub.flush()
        assert [(m["channel"], m["data"]) for m in collect(p, 1)] == [(channels[-1].encode(), b"last")]


def test_close_releases_a_thread_in_listen(brokers):
    b = brokers()
    c = fastbus.Client(endpoint=b.endpoint)
    p = c.pubsub(ignore_subscribe_messages=True)
    p.subscribe("x")
    done = threading.Event()

    def listen() -> None:
        for _m in p.listen():
            pass
        done.set()

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    c.close()
    assert done.wait(3), "listen() still blocked after close()"
    assert time.monotonic() - t0 < 3


def test_asyncio_publish_never_blocks_the_loop_on_a_full_buffer(brokers):
    b = brokers()

    async def main() -> None:
        # A paused broker would do; no broker at all fills the buffer the same way.
        c = fastbus.aio.Client(endpoint="tcp://127.0.0.1:9", max_buffer_bytes=32 * 1024, max_bytes=2048,
                               block_timeout=0.5)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())
        with pytest.raises(fastbus.PublishTimeout):
            for _ in range(10 ** 6):
                await c.publish("x", b"y" * 200)
        t.cancel()
        assert ticks >= 20
        await c.aclose(timeout=0.2)

    asyncio.run(main())


# -- who may be a broker -----------------------------------------------------------------

def test_only_allowed_peers_may_be_brokers_and_limits_apply_to_them(brokers):
    closed = brokers("--max-subscriptions", "10")
    s = raw_dealer(closed.endpoint)
    reply = _hello(s, role="broker")
    assert "kick" in reply and reply["kick"].get("refused") and "--allow-broker" in reply["kick"]["reason"]
    assert closed.stats()["drops"]["not_a_broker"] == 1 and closed.stats()["peers"] == 0
    s.close()
    open_ = brokers("--max-subscriptions", "10", "--allow-broker", "local")
    s = raw_dealer(open_.endpoint)
    assert "limits" in _hello(s, role="broker")
    ops = P.encode_ops((SUBSCRIBE, b"k%d" % i, False) for i in range(15))
    s.send_multipart([P.SUB, P.pack_u64(1), ops])
    replies = _replies(s, P.CONFIRM)
    refused = [f for f in replies if f[0] == P.REFUSED]
    assert len(refused) == 1 and len(P.decode_ops(refused[0][2])) == 5    # limits apply to brokers too
    s.close()


def test_a_refused_downstream_broker_says_why_and_does_not_spin(brokers, tmp_path):
    up = brokers()
    down = brokers("--upstream", up.endpoint, "--log-level", "INFO")
    time.sleep(2.5)
    assert up.stats()["peers"] <= 1 and up.stats()["links"].get("broker", 0) == 0
    assert 1 <= up.stats()["drops"]["not_a_broker"] <= 6                  # retried at the probe pace, not in a loop
    assert "refused this broker" in down.log()


def test_a_downstream_broker_proves_itself_with_its_curve_key(brokers, tmp_path):
    """Federation over CURVE: the downstream connects with its own key,
    which the upstream lists as a broker's; the same broker with a key the
    upstream accepts only from clients is refused the broker role."""
    import zmq.auth

    def cert(name: str) -> tuple[str, str]:
        public_file, secret_file = zmq.auth.create_certificates(str(tmp_path), name)
        return public_file, secret_file

    up_pub_file, up_sec_file = cert("up")
    down_pub_file, down_sec_file = cert("down")
    client_pub_file, client_sec_file = cert("client")
    up_key = zmq.auth.load_certificate(up_pub_file)[0].decode()
    client_pub, client_sec = (k.decode() for k in zmq.auth.load_certificate(client_sec_file))
    up = brokers("--curve-cert", up_sec_file, "--curve-allow-broker", down_pub_file,
                 "--curve-allow", client_pub_file, curve=(up_key, client_pub, client_sec))
    down = brokers("--upstream", up.endpoint, "--upstream-curve-server-key", up_pub_file,
                   "--upstream-curve-cert", down_sec_file)
    wait_for(lambda: up.stats()["links"].get("broker", 0) == 1, what="the downstream broker's session upstream")
    with fastbus.Client(endpoint=up.endpoint, curve_server_key=up_key, curve_public_key=client_pub,
                        curve_secret_key=client_sec) as sub_client, \
            fastbus.Client(endpoint=down.endpoint) as pub:
        p = sub_client.pubsub(ignore_subscribe_messages=True)
        p.subscribe("fed")
        wait_wanted(pub, "fed")                           # the subscription came down over CURVE
        pub.publish("fed", b"up we go")
        pub.flush()
        assert [(m["channel"], m["data"]) for m in collect(p, 1)] == [(b"fed", b"up we go")]
    # A key the upstream takes from clients only: not a broker.
    impostor = brokers("--upstream", up.endpoint, "--upstream-curve-server-key", up_key,
                       "--upstream-curve-cert", client_sec_file, "--log-level", "INFO")
    wait_for(lambda: up.stats()["drops"]["not_a_broker"] >= 1, what="the impostor refused")
    wait_for(lambda: "refused this broker" in impostor.log(), what="the impostor told")
    assert up.stats()["links"].get("broker", 0) == 1


def test_a_client_closing_with_its_pubsubs_leaves_no_peer_lost(brokers):
    """A client that closes (or a process exiting, which shuts clients down)
    with a subscribed PubSub leaves the broker cleanly: it counts no peer
    lost.  (Its PubSubs used to say goodbye first; the broker then sent the
    publishing connection the WANT of their subscriptions going, which met
    a socket already closed: "left: unreachable", 6 of 15 exits of a
    channels process under load.)"""
    b = brokers()
    for i in range(20):
        c = fastbus.Client(endpoint=b.endpoint)
        p = c.pubsub()
        p.subscribe(f"room.{i}")
        c.publish(f"room.{i}", b"x")
        c.flush()
        c.close()
    wait_for(lambda: b.stats()["peers"] == 0, what="every client gone")
    drops = b.stats()["drops"]
    assert not drops.get("unreachable") and not drops.get("unknown_peer"), drops


def _next(s: zmq.Socket, cmd: bytes, timeout: float = 10.0) -> list:
    """The next message ``cmd`` from the broker (others skipped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if s.poll(100):
            frames = s.recv_multipart()
            if frames[0] == cmd:
                return frames
    raise AssertionError(f"no {cmd!r} from the broker within {timeout} s")


def test_bye_is_answered_once_the_broker_has_forgotten_the_session(brokers):
    """A session's BYE is answered (its WELCOME says "bye") once the broker
    has forgotten it, and the client closes its connection only then
    (docs/PROTOCOL.md, Sessions, step 6): nothing the broker sends for
    others can meet a connection already closed, whatever order the
    broker reads a client's two connections in."""
    b = brokers()
    s = raw_dealer(b.endpoint)
    s.send_multipart([P.HELLO, P.dump_json({"v": P.VERSION, "role": "client", "pub": True, "name": "raw"})])
    assert P.load_json(_next(s, P.WELCOME)[1])["bye"] is True
    s.send_multipart([P.BYE])
    _next(s, P.BYE)
    assert b.stats()["peers"] == 0                   # forgotten before the answer went
    s.close()
    # The client: when close() returns, the broker has forgotten both of its
    # connections (no waiting here).
    for i in range(10):
        c = fastbus.Client(endpoint=b.endpoint)
        p = c.pubsub()
        p.subscribe(f"room.{i}")
        c.close()
        assert b.stats()["peers"] == 0, i
    drops = b.stats()["drops"]
    assert not drops.get("unreachable") and not drops.get("unknown_peer"), drops
