"""Redis's glob patterns in the C core (csrc/fb_glob.h, issue 23 item 1):
fastbus matches exactly what a real Redis server matches, compared on
random patterns and channels through PSUBSCRIBE and PUBLISH."""

from __future__ import annotations

import random

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
