"""Redis's glob patterns in the C core (csrc/fb_glob.h, issue 23 item 1):
fastbus matches exactly what a real Redis server matches, compared on
random patterns and channels through PSUBSCRIBE and PUBLISH."""

from __future__ import annotations

import random

import pytest
import redis

from fastbus._core import glob_match, glob_prefix

#: Bytes that make globs interesting (every special character), and a few
#: plain ones; channels draw from the same, so escapes and classes meet
#: the characters they name.
ALPHABET = b"ab-]^\\*?["


def _random(rng: random.Random, n: int) -> bytes:
    return bytes(rng.choice(ALPHABET) for _ in range(rng.randrange(n)))


def test_matches_exactly_what_redis_matches(redis_url):
    rng = random.Random(23)
    patterns = sorted({_random(rng, 7) for _ in range(400)} - {b""})
    channels = sorted({_random(rng, 6) for _ in range(400)} - {b""})
    client = redis.Redis.from_url(redis_url)
    p = client.pubsub()
    try:
        for i in range(0, len(patterns), 100):
            p.psubscribe(*patterns[i:i + 100])
        confirmed = 0
        while confirmed < len(patterns):
            m = p.get_message(timeout=5)
            assert m is not None, f"only {confirmed} of {len(patterns)} psubscribe confirmations"
            confirmed += m["type"] == "psubscribe"
        differ = []
        for ch in channels:
            n = client.publish(ch, b"x")
            got = set()
            while len(got) < n:
                m = p.get_message(timeout=5)
                assert m is not None
                if m["type"] == "pmessage":
                    got.add(m["pattern"])
            want = {pat for pat in patterns if glob_match(pat, ch)}
            if got != want:
                differ.append((ch, sorted(got - want), sorted(want - got)))
        assert not differ, f"(channel, Redis only, fastbus only): {differ[:10]}"
        assert sum(glob_match(pat, ch) for pat in patterns for ch in channels) > 200   # a comparison with matches in it
    finally:
        p.close()
        client.close()


def test_the_literal_prefix_holds_every_match():
    """A broker holds a glob under its literal prefix: every channel the
    glob matches must start with it, and a ``prefix*`` glob needs no other
    check."""
    assert glob_prefix("user.*.events") == (b"user.", False)
    assert glob_prefix("news.*") == (b"news.", True)
    assert glob_prefix(b"a\\*b*") == (b"a*b", True)
    assert glob_prefix("exact") == (b"exact", False) and glob_match("exact", "exact")
    rng = random.Random(7)
    for _ in range(20000):
        pat, ch = _random(rng, 8), _random(rng, 8)
        prefix, star = glob_prefix(pat)
        if glob_match(pat, ch):
            assert ch.startswith(prefix), (pat, ch)
        elif star:
            assert not ch.startswith(prefix), (pat, ch)


# -- globs through a broker (PubSub, its asyncio twin, the sharded client) ----

def _sync_received(client, groups: list, channels: list, reader: str) -> list:
    """Subscribe a PubSub to each group of patterns, publish every channel
    once (its name as data), and return what each PubSub read, as
    [(channel, pattern)] (pattern None from get_batch)."""
    subs = [client.pubsub(ignore_subscribe_messages=True) for _ in groups]
    for p, g in zip(subs, groups):
        p.psubscribe(*g)
    for ch in channels:
        client.publish(ch, ch)
    client.flush()
    got = []
    for p in subs:
        mine = []
        if reader == "get_batch":
            while batch := p.get_batch(timeout=0.5):
                mine += [(ch, None) for ch, _d in batch]
        else:
            while (m := p.get_message(timeout=0.5)) is not None:
                mine.append((m["channel"], m["pattern"]))
        got.append(mine)
    return got


async def _async_received(client, groups: list, channels: list) -> list:
    subs = [client.pubsub(ignore_subscribe_messages=True) for _ in groups]
    for p, g in zip(subs, groups):
        await p.psubscribe(*g)
    for ch in channels:
        await client.publish(ch, ch)
    await client.flush()
    got = []
    for p in subs:
        mine = []
        while (m := await p.get_message(timeout=0.5)) is not None:
            mine.append((m["channel"], m["pattern"]))
        got.append(mine)
    return got


def _expected(groups: list, channels: list) -> list:
    """What Redis delivers, once per channel (fastbus's rule): the channels
    any pattern of a group matches, each with the matching pattern of the
    longest literal prefix (the first given of those)."""
    out = []
    for g in groups:
        mine = []
        for ch in channels:
            matching = [p for p in g if glob_match(p, ch)]
            if matching:
                mine.append((ch, max(matching, key=lambda p: (len(glob_prefix(p)[0]), -g.index(p)))))
        out.append(mine)
    return out


def _glob_workload(seed: int) -> tuple[list, list]:
    rng = random.Random(seed)
    patterns = sorted({b"ch." + _random(rng, 6) for _ in range(120)} | {b"ch.*", b"ch.a*", b"*b"})
    channels = sorted({b"ch." + _random(rng, 5) for _ in range(300)} | {b"other", b"ch."})
    rng.shuffle(patterns)
    return patterns, channels


@pytest.mark.parametrize("reader", ["get_message", "get_batch", "asyncio", "sharded"])
def test_a_pubsub_gets_what_redis_globs_match(brokers, redis_url, reader):
    """Four PubSubs hold 123 random globs (held at the broker under their
    literal prefixes, several sharing one) and 302 channels are published
    once each: each PubSub gets exactly the channels a Redis server would
    send it, once, with the pattern fastbus's rule names; and the channel
    set agrees with a real server's PSUBSCRIBE."""
    import asyncio

    import fastbus
    import fastbus.aio

    patterns, channels = _glob_workload(5)
    groups = [patterns[i::4] for i in range(4)]
    want = _expected(groups, channels)
    # The model's channel sets are Redis's own (the first test compares
    # glob_match with the server; here the whole subscriber path).
    r = redis.Redis.from_url(redis_url)
    try:
        p = r.pubsub()
        p.psubscribe(*groups[0])
        confirmed = 0
        while confirmed < len(groups[0]):
            m = p.get_message(timeout=5)
            assert m is not None
            confirmed += m["type"] == "psubscribe"
        for ch in channels:
            r.publish(ch, ch)
        seen = set()
        while (m := p.get_message(timeout=0.5)) is not None:
            seen.add(m["channel"])
        assert seen == {ch for ch, _p in want[0]}
        p.close()
    finally:
        r.close()

    if reader == "sharded":
        bs = [brokers(), brokers()]
        c = fastbus.ShardedClient([b.endpoint for b in bs])
        try:
            got = _sync_received(c, groups, channels, "get_message")
        finally:
            c.close()
    elif reader == "asyncio":
        b = brokers()

        async def run():
            c = fastbus.aio.Client(b.endpoint)
            try:
                return await _async_received(c, groups, channels)
            finally:
                await c.aclose()
        got = asyncio.run(run())
    else:
        b = brokers()
        with fastbus.Client(b.endpoint) as c:
            got = _sync_received(c, groups, channels, reader)
    if reader == "get_batch":
        want = [[(ch, None) for ch, _p in mine] for mine in want]
    if reader == "sharded":                 # no order between brokers
        got, want = [sorted(g) for g in got], [sorted(w) for w in want]
    assert got == want
    assert sum(map(len, want)) > 150


def test_the_broker_matches_globs_and_its_neighbours_see_prefixes(brokers):
    """The broker that delivers matches a glob exactly (a subscriber is
    sent only what its globs match, not everything under their prefix);
    the publishers' filters, and an upstream broker, hold the prefix; a
    subscriber's globs go with it."""
    import fastbus
    from brokers import collect, confirm, quiet, wait_for

    up = brokers("--allow-broker", "local")
    b = brokers("--upstream", up.endpoint)
    with fastbus.Client(b.endpoint) as c, fastbus.Client(up.endpoint) as far:
        p = c.pubsub()
        p.psubscribe("user.*.events", "user.?", "[xy]*")
        confirm(p, 3)
        assert b.stats()["subscriptions"] == 3
        # Upstream: the prefixes, subsumed (the empty one of [xy]* holds user.).
        wait_for(lambda: up.stats()["keys"] == 1, what="the upstream broker to hold the empty prefix")
        channels = [f"user.{i}.other" for i in range(200)] + ["user.1", "user.1.events", "user.12", "x1", "z"]
        for ch in channels:
            c.publish(ch, ch)                   # through b
            far.publish(ch, ch)                 # through up, then b
        c.flush()
        far.flush()
        got = sorted((m["channel"], m["pattern"]) for m in collect(p, 6))
        assert got == sorted([(b"user.1", b"user.?"), (b"user.1.events", b"user.*.events"), (b"x1", b"[xy]*")] * 2)
        assert quiet(p) == []
        out = b.stats()["messages_out"]
        assert out < 50, f"the broker sent {out} messages for 6 matches: it did not match the globs"
        p.punsubscribe("user.?", "[xy]*")
        confirm(p, 2)
        assert b.stats()["subscriptions"] == 1
        assert c.is_wanted("user.zz")           # user.*.events still holds user.
        p.punsubscribe()
        confirm(p, 1)
        wait_for(lambda: b.stats()["subscriptions"] == 0 and b.stats()["keys"] == 0, what="b to drop the globs")
        wait_for(lambda: not c.is_wanted("user.1.events"), what="the publisher to stop wanting user.")
        q = c.pubsub()
        q.psubscribe("user.*.events")
        confirm(q, 1)
    wait_for(lambda: b.stats()["subscriptions"] == 0 and b.stats()["keys"] == 0,
             what="b to drop a closed subscriber's globs")
