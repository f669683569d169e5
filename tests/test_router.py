"""Router: a broker's routing step, received batches into per-link outboxes."""

import pytest

from fastbus import BatchError, Router, Trie, decode, encode


def make():
    t = Trie()
    r = Router(t, max_messages=3, max_bytes=0)
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


def test_globs_are_matched_where_they_are_delivered():
    """A glob held under its literal prefix by the router's id for it: a
    link gets what the glob matches, once, however many of its keys match."""
    from fastbus._core import glob_prefix
    from fastbus.errors import NotSubscribedError
    t, r = make()
    g = r.add_glob(1, "user.*.events")
    assert g >= 1 << 32 and r.globs == 1
    t.add(glob_prefix("user.*.events")[0], g, prefix=True)
    t.add(b"user.1.events", 1)                            # the same link, exactly: still once
    batch = encode([(b"user.1.events", b"1"), (b"user.2", b"2"), (b"user.3.events", b"3")])
    assert r.route(batch, now_ns=0) == 3
    assert decode(r.take(1)) == [(b"user.1.events", b"1"), (b"user.3.events", b"3")]
    assert r.stats()["unrouted"] == 1
    r.remove_glob(g)
    with pytest.raises(NotSubscribedError):
        r.remove_glob(g)
    assert r.globs == 0



def test_queue_groups_give_each_record_to_exactly_one_member():
    """A queue group held in the trie once, by the router's id for it:
    through joins, leaves, held and away members, each record reaches
    exactly one member (never its source), round robin among the free
    ones; a plain subscriber of the same channel gets every record."""
    import random

    from fastbus.errors import NotSubscribedError
    t = Trie()
    r = Router(t, max_messages=100_000, max_bytes=0)
    links = list(range(1, 8))
    for link in links:
        r.add_link(link)
    g = r.add_group()
    assert g >= 1 << 33
    t.add(b"jobs", g)
    t.add(b"jobs", 7)                                    # plain: every record
    rng = random.Random(7)
    members: set[int] = set()
    got: dict[int, list[bytes]] = {link: [] for link in links}
    seq = 0
    for _round in range(200):
        for link in links[:6]:
            if rng.random() < 0.3:
                if link in members:
                    r.group_leave(g, link)
                    members.discard(link)
                else:
                    r.group_join(g, link)
                    members.add(link)
            r.hold(link, rng.random() < 0.2)
            r.set_away(link, rng.random() < 0.1)
        source = rng.choice(links[:6])
        records = [(b"jobs", b"%d" % (seq + i)) for i in range(5)]
        seq += 5
        r.route(encode(records), source=source, now_ns=0)
        for link in links:
            batch = r.take(link)
            if batch is not None:
                got[link] += [p for _t, p in decode(batch)]
        assert not any(p in got[source] for _t, p in records)     # never back to its source
        eligible = members - {source}
        if not eligible:
            continue
        taken = {p: [m for m in eligible if p in got[m]] for _t, p in records}
        assert all(len(v) == 1 for v in taken.values()), (members, source, taken)
    assert got[7] == [b"%d" % i for i in range(seq)]
    assert sum(len(got[m]) for m in links[:6]) <= seq
    with pytest.raises(NotSubscribedError):
        r.group_leave(g, 99)
    r.remove_group(g)
    assert r.group_size(g) == 0

def test_a_held_group_gives_each_record_to_one_member_or_keeps_it_for_the_next():
    """Through members joining (then given the backlog) and leaving, each
    record reaches exactly one member, in order overall per member, and
    what came while none was there waits, in order, for the next one."""
    import random

    t = Trie()
    r = Router(t, max_messages=100_000, max_bytes=0)
    for link in (1, 2, 3):
        r.add_link(link)
    g = r.add_group()
    t.add(b"jobs", g)
    r.group_hold(g)
    rng = random.Random(11)
    members: set[int] = set()
    got: dict[int, list[int]] = {1: [], 2: [], 3: []}
    seq = 0

    def take_all():
        for link in (1, 2, 3):
            batch = r.take(link)
            if batch is not None:
                got[link] += [int(p) for _t, p in decode(batch)]

    for _round in range(300):
        link = rng.choice((1, 2, 3))
        if rng.random() < 0.3:
            take_all()                                   # (what it was given is its own)
            if link in members:
                r.group_leave(g, link)
                members.discard(link)
            else:
                r.group_join(g, link)
                members.add(link)
                n, _full = r.group_give(g)
                assert r.group_held(g) == 0
        records = [(b"jobs", b"%d" % (seq + i)) for i in range(3)]
        seq += 3
        r.route(encode(records), source=None, now_ns=0)
        if not members:
            assert r.group_held(g) >= 3
        take_all()
    r.group_join(g, 1)
    r.group_give(g)
    take_all()
    everything = sorted(p for ps in got.values() for p in ps)
    assert everything == list(range(seq)), "a record lost or given twice"
    assert all(ps == sorted(ps) for ps in got.values())
    st = r.stats()
    assert st["held_kept"] == st["held_given"] > 0 and r.held_bytes == 0


def test_no_linger_every_outbox_that_holds_records_is_due():
    t = Trie()
    r = Router(t, max_messages=3, max_bytes=0)          # max_delay=0: no linger
    for link in (1, 2):
        r.add_link(link)
    t.add(b"x", 1)
    t.add(b"y", 2)
    assert r.deadline_ns() is None and r.due() == []
    r.route(encode([(b"x", b"1")]), now_ns=1_000)
    assert r.due(now_ns=1_000) == [1] and r.deadline_ns() == 0
    assert decode(r.take(1, now_ns=1_000)) == [(b"x", b"1")]
    r.route(encode([(b"x", b"2")]), now_ns=1_001)       # just sent to: due again at once
    assert r.due(now_ns=1_001) == [1]
    assert r.queued(1) == (1, len(r.take(1)))
    assert r.deadline_ns() is None


def test_linger_idle_link_sends_at_once_busy_link_once_per_linger():
    t = Trie()
    r = Router(t, max_messages=3, max_bytes=0, max_delay=1e-6)   # linger 1000 ns
    for link in (1, 2):
        r.add_link(link)
    t.add(b"x", 1)
    t.add(b"y", 2)
    r.route(encode([(b"x", b"1")]), now_ns=5_000)
    assert r.due(now_ns=5_000) == [1]                   # never sent to: idle
    r.take(1, now_ns=5_000)
    r.route(encode([(b"x", b"2")]), now_ns=5_100)
    assert r.due(now_ns=5_100) == []                    # sent 100 ns ago: lingers
    assert r.deadline_ns() == 6_000
    r.route(encode([(b"x", b"3")]), now_ns=5_900)
    assert r.due(now_ns=5_999) == []
    assert r.due(now_ns=6_000) == [1]
    assert decode(r.take(1, now_ns=6_000)) == [(b"x", b"2"), (b"x", b"3")]   # one batch
    r.route(encode([(b"x", b"4")]), now_ns=9_000)       # idle longer than the linger
    assert r.due(now_ns=9_000) == [1]
    r.take(1, now_ns=9_000)
    # Full goes at once, linger or not: receive() names it (again while it
    # stays full), once per call however many records it took.
    assert r.receive(encode([(b"x", b"5")]), now_ns=9_001) is None
    assert r.receive(encode([(b"y", b"%d" % i) for i in range(4)]), now_ns=9_001) == [2]
    assert r.due(now_ns=9_001) == [2]
    assert r.receive(encode([(b"y", b"4")]), now_ns=9_001) == [2]
    assert [p for _t, p in decode(r.take(2, now_ns=9_001))] == [b"0", b"1", b"2", b"3", b"4"]
    assert r.deadline_ns() == 10_000                    # link 1's lone message: 9_000 + 1000


def test_held_link_is_due_only_when_full():
    t = Trie()
    r = Router(t, max_messages=2, max_bytes=0)
    r.add_link(1)
    t.add(b"x", 1)
    r.hold(1)
    r.route(encode([(b"x", b"1")]))
    assert r.due() == [] and r.deadline_ns() is None
    assert r.receive(encode([(b"x", b"2")])) == [1]
    assert r.due() == [1]
    r.take(1)
    r.route(encode([(b"x", b"3")]))
    assert r.due() == []
    r.hold(1, False)
    assert r.due() == [1]
    r.hold(99)                                          # unknown link: nothing


def test_malformed_batch_routes_nothing():
    t, r = make()
    t.add(b"a", 1, prefix=True)
    data = bytes(encode([(b"a", b"1"), (b"ab", b"2")]))
    for cut in range(len(data)):
        with pytest.raises(BatchError):
            r.route(data[:cut])
    assert r.pending() == [] and r.stats()["rejected"] == len(data)
    many = Router(t, max_records=1)
    many.add_link(1)
    with pytest.raises(BatchError, match="limit"):
        many.route(data)
    with pytest.raises(BatchError):
        r.receive(data[:-1])


def test_records_over_the_size_limits_are_dropped_alone():
    """A record over max_topic/max_payload is not routed, and counted; the
    rest of its batch is."""
    t = Trie()
    r = Router(t, max_topic=2, max_payload=3)
    r.add_link(1)
    t.add(b"a", 1, prefix=True)
    data = bytes(encode([(b"a", b"1"), (b"abc", b"2"), (b"ab", b"3"), (b"a", b"long"), (b"a", b"5")]))
    assert r.route(data) == 5
    assert decode(r.take(1)) == [(b"a", b"1"), (b"ab", b"3"), (b"a", b"5")]
    assert r.oversize == 2 and r.stats()["oversize"] == 2 and r.stats()["records"] == 5


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
