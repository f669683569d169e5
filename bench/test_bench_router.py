"""The broker's routing step alone (no network): decode a received batch,
match it, append every record to its subscribers' outboxes, hand the due
batches over.  Seed 000's workload: 50 channels, 20-byte messages, 2
subscribers on every channel; batches of 1000 as a publisher sends them.

``linger``: ``route`` with a 1 ms linger (``max_delay=0.001``; a link gets
at most one batch per ms, or a full one), the figure compared across
versions; ``turn``: the broker's own path with no linger, ``receive()``
then every due batch taken after each received batch, i.e. every received
batch its own turn, the most batches natural batching can make."""

import random

import pytest

import fastbus

BATCH = 1000


@pytest.mark.parametrize("mode", ["linger", "turn"])
@pytest.mark.parametrize("subscribers", [2, 8])
def test_route(benchmark, record, subscribers, mode):
    trie = fastbus.Trie()
    router = fastbus.Router(trie, max_messages=4096, max_bytes=256 * 1024,
                            max_delay=0.001 if mode == "linger" else 0.0)
    chans = [str(i).encode() for i in range(50)]
    for link in range(1, subscribers + 1):
        router.add_link(link)
        for c in chans:
            trie.add(c, link)
    rng = random.Random(1)
    batches = [fastbus.encode([(rng.choice(chans), b"x" * 20) for _ in range(BATCH)]) for _ in range(64)]
    it = iter(range(10 ** 12))

    def route():
        router.route(batches[next(it) % 64], source=0)
        for link in router.due():
            router.take(link)

    def turn():
        full = router.receive(batches[next(it) % 64], source=0)
        if full:
            for link in full:
                router.take(link)
        for link in router.due():
            router.take(link)

    benchmark(route if mode == "linger" else turn)
    rate = BATCH / benchmark.stats.stats.median
    benchmark.extra_info["messages_per_s"] = rate
    record("broker routing alone, M messages/s in (one core)", f"fastbus, {subscribers} subscribers, {mode}",
           BATCH, rate / 1e6)
