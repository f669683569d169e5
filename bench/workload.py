"""The subscription workload of the trie benchmarks (bench/test_bench_trie.py,
bench/trie_memory.py), and adapters that give every implementation the same
job: "which subscribers want this topic?".

N subscriptions: the seed's 50 decimal channels "0".."49" held by 10
subscribers each (500), and N - 500 topic-like keys such as
b"market.NYSE.00042.trades" (~24 bytes), one subscriber each, 100 keys per
subscriber.  All are *prefix* subscriptions, because that is what the peers'
prefixes() answers; fastbus matches exact keys with the same walk.

Topics to route: 90% subscribed topic-like keys, 5% channels, 5% misses,
drawn at random (the worst case for caches: no locality).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

EXCHANGES = ("NYSE", "NASDAQ", "LSE", "TSE", "HKEX", "SSE", "EURONEXT", "TSX")
KINDS = ("trades", "quotes", "book", "ohlc", "news")
CHANNELS = [str(i).encode() for i in range(50)]
CHANNEL_SUBSCRIBERS = 10
CACHE = Path(os.environ.get("FASTBUS_BENCH_CACHE", Path(__file__).parent / ".cache"))


def topic_keys(n: int) -> list[bytes]:
    per_symbol = len(EXCHANGES) * len(KINDS)
    symbols = -(-n // per_symbol)
    keys = [f"market.{ex}.{s:05d}.{k}".encode() for s in range(symbols) for ex in EXCHANGES for k in KINDS]
    return keys[:n]


def subscriptions(n: int) -> list[tuple[bytes, int]]:
    """(key, subscriber) pairs, n in all."""
    subs = [(ch, s) for ch in CHANNELS for s in range(CHANNEL_SUBSCRIBERS)]
    rest = n - len(subs)
    per = max(1, rest // 100)
    subs += [(k, CHANNEL_SUBSCRIBERS + i % per) for i, k in enumerate(topic_keys(rest))]
    random.Random(n).shuffle(subs)
    return subs


def topics(subs: list[tuple[bytes, int]], count: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    keys = [k for k, _s in subs if k.startswith(b"market.")]
    out = []
    for _ in range(count):
        r = rng.random()
        if r < 0.90:
            out.append(rng.choice(keys))
        elif r < 0.95:
            out.append(rng.choice(CHANNELS))
        else:
            out.append(b"market.NOPE.%05d.trades" % rng.randrange(100000))
    return out


def grouped(subs):
    table: dict[bytes, set[int]] = {}
    for k, s in subs:
        table.setdefault(k, set()).add(s)
    return table


# --- adapters: build(subs) -> table; route(table, topics) -> subscriber count

def build_fastbus(subs):
    import fastbus
    t = fastbus.Trie()
    for k, s in subs:
        t.add(k, s, prefix=True)
    return t


def route_fastbus_batch(t, topics):
    _offsets, ids = t.match_flat(topics)
    return len(ids)


def route_fastbus_single(t, topics):
    n = 0
    match = t.match
    for topic in topics:
        n += len(match(topic))
    return n


def build_datrie(subs):
    """datrie (C double-array trie) with values = subscriber sets.  Inserting
    1M keys takes minutes, so the built trie is cached on disk."""
    import datrie
    table = grouped(subs)
    alphabet = "".join(sorted({chr(c) for k in table for c in k}))
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"datrie-{len(subs)}.trie"
    if path.exists():
        return datrie.Trie.load(str(path))
    t = datrie.Trie(alphabet)
    for k in sorted(table):
        t[k.decode()] = table[k]
    t.save(str(path))
    return t


def route_datrie_prefixes(t, topics):
    """prefixes() alone, as in DESIGN.md's anchor: keys, no subscribers."""
    n = 0
    prefixes = t.prefixes
    for topic in topics:
        n += len(prefixes(topic.decode()))
    return n


def route_datrie(t, topics):
    """Same answer as fastbus: the distinct subscribers of each topic."""
    n = 0
    values = t.prefix_values
    for topic in topics:
        vals = values(topic.decode())
        n += len(vals[0]) if len(vals) == 1 else len(set().union(*vals))
    return n


def build_pygtrie(subs):
    import pygtrie
    t = pygtrie.CharTrie()
    for k, s in grouped(subs).items():
        t[k.decode()] = s
    return t


def route_pygtrie(t, topics):
    n = 0
    prefixes = t.prefixes
    for topic in topics:
        vals = [v for _k, v in prefixes(topic.decode())]
        n += len(vals[0]) if len(vals) == 1 else len(set().union(*vals))
    return n


def build_dict(subs):
    # Own copies of the keys, as every other table has (memory is compared).
    return {bytes(bytearray(k)): v for k, v in grouped(subs).items()}


def route_dict(table, topics):
    """The baseline: look up every prefix of the topic in a dict."""
    n = 0
    get = table.get
    for topic in topics:
        vals = [v for i in range(len(topic) + 1) if (v := get(topic[:i])) is not None]
        n += len(vals[0]) if len(vals) == 1 else len(set().union(*vals))
    return n


IMPLS = {
    "fastbus-batch": (build_fastbus, route_fastbus_batch),
    "fastbus-single": (build_fastbus, route_fastbus_single),
    "datrie-prefixes": (build_datrie, route_datrie_prefixes),
    "datrie": (build_datrie, route_datrie),
    "pygtrie": (build_pygtrie, route_pygtrie),
    "dict": (build_dict, route_dict),
}
