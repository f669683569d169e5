"""Request/reply (``Client.request``, ``message.respond``) with real brokers
in subprocesses: replies matched to their requests under many concurrent
requests, no responders said at once (by the client's filter or by the
broker), a responder killed mid-request, a federation, and the protocol's
reserved headers refused from users."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from brokers import free_port, raw_dealer, wait_for, wait_wanted

import fastbus
from fastbus import protocol as P


class Responder(threading.Thread):
    """Answers every request on ``channel`` with ``answer(message)`` (None:
    no answer), until stopped."""

    def __init__(self, client: fastbus.Client, channel: str, answer) -> None:
        super().__init__(daemon=True)
        self.ps = client.pubsub(ignore_subscribe_messages=True)
        self.ps.subscribe(channel)
        self.answer = answer
        self.stopping = False
        self.seen = 0
        self.start()

    def run(self) -> None:
        while not self.stopping:
            m = self.ps.get_message(timeout=0.1)
            if m is None or m["type"] != "message":
                continue                          # (notices: a reconnect, a disconnection)
            self.seen += 1
            reply = self.answer(m)
            if reply is not None:
                m.respond(*reply) if isinstance(reply, tuple) else m.respond(reply)

    def stop(self) -> None:
        self.stopping = True
        self.join(5)


def test_a_request_gets_its_reply_with_headers_both_ways(brokers, clients):
    b = brokers()
    seen = []

    def answer(m):
        seen.append(m)
        return m["data"].upper(), {"status": "ok", "bin": b"\xff"}

    r = Responder(clients(b.endpoint), "svc.upper", answer)
    c = clients(b.endpoint)
    reply = c.request("svc.upper", b"hello", timeout=10, headers={"traceparent": "00-abc-01"})
    assert reply["data"] == b"HELLO"
    assert reply["headers"] == {"status": b"ok", "bin": b"\xff"}
    assert reply["type"] == "message" and reply["channel"].startswith(b"_INBOX.")
    # What the responder got: the request's own headers, and where to answer;
    # the protocol's header is not among the user's.
    req = seen[0]
    assert req["headers"] == {"traceparent": b"00-abc-01"}
    assert req["reply_to"] == reply["channel"]
    # A publish to reply_to answers as well as respond() does.
    r.answer = lambda m: r.ps.responder.publish(m["reply_to"], b"by publish") and None
    assert c.request("svc.upper", b"x", timeout=10)["data"] == b"by publish"
    r.stop()


def test_decode_responses_gives_str_replies(brokers, clients):
    b = brokers()
    r = Responder(clients(b.endpoint, decode_responses=True), "echo", lambda m: ("got " + m["data"], {"k": "v"}))
    c = clients(b.endpoint, decode_responses=True)
    reply = c.request("echo", "hi", timeout=10)
    assert reply["data"] == "got hi" and reply["headers"] == {"k": "v"} and isinstance(reply["channel"], str)
    r.stop()


def test_many_concurrent_requests_are_matched_by_id(brokers, clients):
    """1,000 requests from 100 threads on one client: each gets its own
    reply, none another's, none lost."""
    b = brokers()
    responders = [Responder(clients(b.endpoint), "work", lambda m: b"r:" + m["data"]) for _ in range(2)]
    # Two responders: every request is answered twice; the second is dropped.
    c = clients(b.endpoint)
    c.request("work", b"warm", timeout=10)

    def ask(i: int) -> bool:
        return c.request("work", b"%d" % i, timeout=30)["data"] == b"r:%d" % i

    with ThreadPoolExecutor(100) as pool:
        results = list(pool.map(ask, range(1000)))
    assert all(results), results.count(False)
    st = c._inbox.replies.stats()
    assert st["replied"] == 1001 and st["no_responders"] == 0 and st["timed_out"] == 0
    # Every second reply is taken and dropped, also those that came once no
    # request waited (the keeper reads the inbox then).
    wait_for(lambda: c._inbox.replies.stats()["unmatched"] == 1001,
             what=lambda: f"every second reply dropped: {c._inbox.replies.stats()}, "
                          f"{c._inbox._session.reader.queued if c._inbox._session.reader else None} queued in the reader")
    for r in responders:
        r.stop()


def test_the_native_reader_takes_the_replies_and_tells_the_broker(brokers, clients):
    """A sync client's replies reach their threads through the native
    reader (matched in C as they are read: no waiting thread reads the
    inbox), and what it took is told the broker (TAKEN), so a session
    that resumes is not sent those replies again."""
    b = brokers()
    responder = Responder(clients(b.endpoint), "work", lambda m: m["data"])
    c = clients(b.endpoint)
    for i in range(5000):
        assert c.request("work", b"%d" % i, timeout=10)["data"] == b"%d" % i
    inbox = c._inbox
    s = inbox._session
    # The reader takes them, but for the few a user thread read while it
    # held the socket (fb_reader.h owner_recent: the keeper, or a
    # requester at its turn; 1 of 5,000 under ASan): matched the same,
    # counted in "replied" below, not in replies_taken.
    assert s.reader is not None and s.reader.replies_taken >= 4900, s.reader.replies_taken
    assert s.taken_told >= 4096                   # (one TAKEN per 4,096 records)
    assert inbox.replies.stats()["replied"] == 5000
    responder.stop()


def test_no_responders_is_said_at_once(brokers, clients):
    """A request to a channel nobody subscribes to: NoResponders, not a
    timeout: from the broker (it routed it to nobody) while the client's
    filter does not know yet, from the filter once it does."""
    b = brokers()
    c = clients(b.endpoint)
    before = b.stats()["no_responders"]
    with pytest.raises(fastbus.NoResponders) as err:
        c.request("nobody.home", b"x", timeout=60)
    assert err.value.channel == "nobody.home"
    filtered = c.stats()["filtered"]
    assert b.stats()["no_responders"] - before + filtered == 1
    # Once the filter holds the broker's view (under its lease), the client
    # itself knows: keep asking until one is filtered, each said at once.
    r = Responder(clients(b.endpoint), "somebody", lambda m: b"here")
    wait_wanted(c, "somebody")
    for _ in range(50):
        with pytest.raises(fastbus.NoResponders):
            c.request("nobody.home", b"x", timeout=60)
    assert c.request("somebody", b"x", timeout=10)["data"] == b"here"
    r.stop()


def test_a_responder_that_does_not_answer_is_a_timeout(brokers, clients):
    b = brokers()
    r = Responder(clients(b.endpoint), "mute", lambda m: None)
    c = clients(b.endpoint)
    with pytest.raises(fastbus.RequestTimeout) as err:
        c.request("mute", b"x", timeout=0.3)
    assert err.value.timeout == 0.3 and isinstance(err.value, TimeoutError)
    assert r.seen == 1
    r.stop()


RESPONDER = textwrap.dedent("""
    import os, sys, fastbus
    c = fastbus.Client(endpoint=sys.argv[1])
    ps = c.pubsub(ignore_subscribe_messages=True)
    ps.subscribe("jobs")
    print("ready", flush=True)
    for m in ps.listen():
        if m["data"] == b"die":
            os.kill(os.getpid(), 9)              # mid-request: no answer, no goodbye
        m.respond(b"done " + m["data"])
""")


def test_a_responder_killed_mid_request(brokers, clients, tmp_path):
    """A responder killed (-9) while it holds a request: that request
    times out (it is not answered, and nothing hangs); another responder
    answers the next ones."""
    b = brokers()
    script = tmp_path / "responder.py"
    script.write_text(RESPONDER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    procs = []
    try:
        def start():
            p = subprocess.Popen([sys.executable, str(script), b.endpoint], stdout=subprocess.PIPE, env=env,
                                 cwd=str(tmp_path))
            assert p.stdout.readline() == b"ready\n"
            procs.append(p)
            return p

        first = start()
        c = clients(b.endpoint)
        assert c.request("jobs", b"1", timeout=10)["data"] == b"done 1"
        with pytest.raises(fastbus.RequestTimeout):
            c.request("jobs", b"die", timeout=1.0)
        assert first.wait(10) == -signal.SIGKILL
        start()
        wait_for(lambda: b.stats()["peers"] >= 3, what="the second responder")
        assert [c.request("jobs", b"%d" % i, timeout=10)["data"] for i in range(3)] == [b"done 0", b"done 1",
                                                                                           b"done 2"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


def test_requests_cross_a_federation(brokers, clients):
    """A requester on a leaf broker, its responder on the top one: the
    reply comes down; nobody anywhere: NoResponders from the leaf."""
    top = brokers("--allow-broker", "local", port=free_port())
    leaf = brokers("--upstream", top.endpoint)
    r = Responder(clients(top.endpoint), "far.svc", lambda m: b"from top")
    c = clients(leaf.endpoint)
    wait_wanted(c, "far.svc")
    assert c.request("far.svc", b"x", timeout=10)["data"] == b"from top"
    with pytest.raises(fastbus.NoResponders):
        c.request("far.nobody", b"x", timeout=60)
    r.stop()


def test_the_protocols_headers_are_refused_from_users(brokers, clients):
    b = brokers()
    c = clients(b.endpoint)
    for bad in ({":reply-to": "_INBOX.x.1"}, {":status": "503"}, {"ok": "1", ":x": "y"}):
        with pytest.raises(ValueError, match="belong to the protocol"):
            c.publish("ch", b"x", headers=bad)
        with pytest.raises(ValueError, match="belong to the protocol"):
            fastbus.encode([(b"ch", b"x", bad)])
    assert c.stats()["published"] == 0


def test_a_raw_request_that_reaches_nobody_gets_the_brokers_503(brokers):
    """The wire: a PUB whose record's headers start with :reply-to, routed
    to nobody, comes back at once as a record on the reply channel with
    :status 503 and no payload, to the requester's own session."""
    b = brokers()
    s = raw_dealer(b.endpoint)
    s.send_multipart([P.HELLO, P.dump_json({"v": 1, "role": "client", "name": "raw", "headers": True})])
    assert s.poll(5000) and s.recv_multipart()[0] == P.WELCOME
    s.send_multipart([P.SUB, P.pack_u64(1), P.encode_ops([(fastbus.SUBSCRIBE, b"_INBOX.raw.", True)])])
    wait_for(lambda: b.stats()["subscriptions"] == 1, what="the inbox subscription")
    req = fastbus.Outbox()
    req.append(b"svc", b"q", headers=None)
    from fastbus._publisher import Publisher
    pub = Publisher(req, lambda: None)
    pub.publish_request(b"svc", b"q2", b"_INBOX.raw.7")
    s.send_multipart([P.PUB, bytes(req.take())])
    records = []
    while not records:
        assert s.poll(5000), "no reply from the broker"
        frames = s.recv_multipart()
        if frames[0] == P.DATA:
            records = fastbus.decode(frames[2], headers=True)
    assert records == [(b"_INBOX.raw.7", b"", {":status": b"503"})]
    assert b.stats()["no_responders"] == 1
    s.close(0)


def test_asyncio_requests_1000_at_once(brokers):
    """The asyncio twin: 1,000 requests in flight at once on one client,
    each its own reply; a responder answers with ``await m.respond()``; a
    request cancelled leaves the others working; NoResponders and
    RequestTimeout as in the sync client."""
    import asyncio

    import fastbus.aio
    b = brokers()

    async def main():
        c = fastbus.aio.Client(endpoint=b.endpoint)
        r = fastbus.aio.Client(endpoint=b.endpoint)
        ps = r.pubsub(ignore_subscribe_messages=True)
        await ps.subscribe("svc", "mute")

        async def serve():
            async for m in ps.listen():
                if m["type"] == "message" and m["channel"] == b"svc":
                    await m.respond(b"r:" + m["data"], {"i": m["data"]})

        server = asyncio.ensure_future(serve())
        try:
            replies = await asyncio.gather(*(c.request("svc", b"%d" % i, timeout=30) for i in range(1000)))
            assert [x["data"] for x in replies] == [b"r:%d" % i for i in range(1000)]
            assert [x["headers"] for x in replies] == [{"i": b"%d" % i} for i in range(1000)]
            slow = asyncio.ensure_future(c.request("mute", b"x", timeout=30))
            await asyncio.sleep(0.05)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            assert (await c.request("svc", b"after", timeout=10))["data"] == b"r:after"
            with pytest.raises(fastbus.RequestTimeout):
                await c.request("mute", b"x", timeout=0.2)
            with pytest.raises(fastbus.NoResponders):
                await c.request("nobody", b"x", timeout=60)
        finally:
            server.cancel()
            await ps.aclose()
            await c.close()
            await r.close()

    asyncio.run(main())


def test_requests_through_a_broker_killed_and_restarted(brokers, clients):
    """The broker killed (-9) with a request in flight: that request ends
    in an exception (its reply can no longer come), never a hang; once the
    broker is back, requests work again without a new client (the inbox
    and the responder subscribe again by themselves)."""
    b = brokers()
    gate = threading.Event()

    def answer(m):
        if m["data"] == b"hold":
            gate.wait(10)                          # in flight while the broker dies
            return None
        return b"r:" + m["data"]

    r = Responder(clients(b.endpoint), "svc", answer)
    c = clients(b.endpoint)
    assert c.request("svc", b"1", timeout=10)["data"] == b"r:1"
    errors = []

    def ask_held():
        try:
            c.request("svc", b"hold", timeout=2)
        except Exception as exc:                   # (what it ends in: asserted below)
            errors.append(exc)

    t = threading.Thread(target=ask_held)
    t.start()
    wait_for(lambda: r.seen == 2, what="the held request at the responder")
    b.kill()
    t.join(10)
    gate.set()
    assert not t.is_alive() and len(errors) == 1 and isinstance(errors[0], fastbus.RequestTimeout), errors
    b.start()

    def answered():
        try:
            return c.request("svc", b"2", timeout=1)["data"] == b"r:2"
        except (fastbus.NoResponders, fastbus.RequestTimeout):
            return False                           # (until both have subscribed again)

    wait_for(answered, timeout=30, interval=0.2, what="a request answered after the restart")
    assert c.request("svc", b"3", timeout=10)["data"] == b"r:3"
    r.stop()
