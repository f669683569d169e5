"""Router: a broker's routing step, received batches into per-link outboxes."""

import pytest

from fastbus import BatchError, Router, Trie, decode, encode


def make():
    t = Trie()
    r = Router(t, max_messages=3, max_bytes=0, max_delay=0.001)
    for link in (1, 2, 3):
        r.add_link(link)
    return t, r


def test_routes_to_every_matching_link_once_except_the_source():
    t, r = make()
    t.add(b"a", 1)
    t.add(b"a", 1, prefix=True)          # two matching keys, one delivery
    t.add(b"a", 2, prefix=True)
    t.add(b"", 3, prefix=True)
    batch = encode([(b"a", b"1"), (b"ab", b"2"), (b"zz", b"3")])
    assert r.route(batch, source=3, now_ns=0) == 3
    assert decode(r.take(1)) == [(b"a", b"1"), (b"ab", b"2")]
    assert decode(r.take(2)) == [(b"a", b"1"), (b"ab", b"2")]
    assert r.take(3) is None             # never back to the source
    s = r.stats()
    assert s["records"] == 3 and s["deliveries"] == 4 and s["unrouted"] == 1


def test_due_by_count_and_age_in_order():
    t, r = make()
    t.add(b"x", 1)
    t.add(b"y", 2)
    r.route(encode([(b"x", b"1")]), now_ns=1_000)
    r.route(encode([(b"y", b"%d" % i) for i in range(3)]), now_ns=2_000)
    assert r.due(now_ns=2_000) == [2]                 # by count
    assert sorted(r.due(now_ns=1_001_000)) == [1, 2]  # and link 1 by age
    assert r.deadline_ns() == 1_001_000
    assert [p for _t, p in decode(r.take(2))] == [b"0", b"1", b"2"]
    assert r.queued(1) == (1, len(r.take(1)))


def test_malformed_batch_routes_nothing():
    t, r = make()
    t.add(b"a", 1, prefix=True)
    data = bytes(encode([(b"a", b"1"), (b"ab", b"2")]))
    for cut in range(len(data)):
        with pytest.raises(BatchError):
            r.route(data[:cut])
    assert r.pending() == [] and r.stats()["rejected"] == len(data)
    limited = Router(t, max_topic=1)
    limited.add_link(1)
    with pytest.raises(BatchError, match="limit"):
        limited.route(data)


def test_links_come_and_go():
    t, r = make()
    t.add(b"a", 1)
    r.route(encode([(b"a", b"1")]))
    assert r.remove_link(1) == 1 and not r.has_link(1)
    assert r.pending() == [] and r.take(1) is None
    with pytest.raises(KeyError):
        r.append(1, b"a", b"b")
    r.add_link(1)
    assert r.append(1, b"direct", b"p") is False
    assert decode(r.take(1)) == [(b"direct", b"p")]
    with pytest.raises(OverflowError):
        r.add_link(-1)
