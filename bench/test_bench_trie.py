"""Trie benchmarks: match cost per topic (single call and batch) against
datrie, pygtrie and a dict of prefixes in the same run, and the cost of add,
remove and remove_subscriber.  Memory: bench/trie_memory.py."""

import itertools

import pytest
from conftest import SIZES
from workload import IMPLS, build_fastbus, subscriptions, topics

BATCH = 1000
ROUNDS = 100        # each round routes a fresh batch: 100,000 distinct random topics
_tables: dict = {}
_subs: dict = {}


def subs_for(n):
    if n not in _subs:
        _subs[n] = subscriptions(n)
    return _subs[n]


def table(build, n):
    key = (build.__name__, n)
    if key not in _tables:
        # Keep one size at a time: the 1M pure-Python tables are large.
        for k in [k for k in _tables if k[1] != n]:
            del _tables[k]
        _tables[key] = build(subs_for(n))
    return _tables[key]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("impl", list(IMPLS))
def test_match(benchmark, record, impl, n):
    """Route random batches of 1000 topics.  Every round gets a new batch
    (the same sequence for every implementation): repeating one batch would
    leave its nodes in cache and measure a warm trie."""
    build, route = IMPLS[impl]
    t = table(build, n)
    pool = topics(subs_for(n), BATCH * (ROUNDS + 2))
    batches = iter(pool[i:i + BATCH] for i in range(0, len(pool), BATCH))
    counts = []

    def setup():
        return (t, next(batches)), {}

    def run(table_, batch):
        counts.append(route(table_, batch))

    benchmark.pedantic(run, setup=setup, rounds=ROUNDS, warmup_rounds=2, iterations=1)
    assert sum(counts) > 0
    ns = benchmark.stats.stats.median / BATCH * 1e9
    benchmark.extra_info["ns_per_topic"] = ns
    record("match ns per topic (median; ratio to fastbus-batch)", impl, n, ns)


_fresh = itertools.count(10 ** 12)


@pytest.mark.parametrize("n", SIZES)
def test_add_and_remove(benchmark, record, n):
    """Add then remove 1000 new keys of one new subscriber in a table of n."""
    t = table(build_fastbus, n)
    keys = [b"bench.add.%07d.key" % i for i in range(1000)]

    def add_remove():
        sub = next(_fresh)
        for k in keys:
            t.add(k, sub)
        for k in keys:
            t.remove(k, sub)

    benchmark(add_remove)
    record("add + remove ns per key", "fastbus", n, benchmark.stats.stats.median / len(keys) * 1e9)


@pytest.mark.parametrize("nkeys", [1, 100])
@pytest.mark.parametrize("n", SIZES)
def test_remove_subscriber(benchmark, record, n, nkeys):
    """Disconnect a subscriber holding nkeys keys in a table of n."""
    t = table(build_fastbus, n)
    keys = [b"market.NYSE.%05d.trades" % i for i in range(nkeys)]

    def setup():
        sub = next(_fresh)
        for k in keys:
            t.add(k, sub)
        return (sub,), {}

    benchmark.pedantic(t.remove_subscriber, setup=setup, rounds=200, iterations=1)
    record(f"remove_subscriber({nkeys} keys) us", "fastbus", n, benchmark.stats.stats.median * 1e6)
