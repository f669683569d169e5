"""The forwarder: examples from the seed article, then model-based tests of
its contract in both modes and across the cap.

The contract, checked after every event:
  * applying the emitted diff, in order, to an upstream table gives, for
    every topic, a match exactly when some downstream key matches (while the
    cap has collapsed upstream to b"", everything matches, by design);
  * at no point while the diff is being applied is a topic that is wanted
    both before and after the event filtered out upstream;
  * no operation is redundant (subscribing what upstream holds, or
    unsubscribing what it does not), and without a cap crossing the diff is
    exactly the change of the minimal upstream set;
  * snapshot() is the upstream set.
"""

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fastbus import SUBSCRIBE, UNSUBSCRIBE, Forwarder, ForwarderError, NotSubscribedError


def test_subsume_article_example():
    # Sustrik: with "A" forwarded, "AB" need not be; when "A" goes, send
    # subscribe(AB) before unsubscribe(A).
    f = Forwarder(mode="subsume")
    assert f.subscribe(1, b"A", prefix=True) == [(SUBSCRIBE, b"A", True)]
    assert f.subscribe(2, b"AB", prefix=True) == []
    assert f.subscribe(3, b"A", prefix=True) == []            # a second holder: nothing
    assert f.remove_peer(1) == []                             # peer 3 still holds A
    assert f.unsubscribe(3, b"A", prefix=True) == [(SUBSCRIBE, b"AB", True), (UNSUBSCRIBE, b"A", True)]
    assert f.snapshot() == [(SUBSCRIBE, b"AB", True)]


def test_dedup_is_xpub():
    f = Forwarder(mode="dedup")
    assert f.subscribe(1, b"A", prefix=True) == [(SUBSCRIBE, b"A", True)]
    assert f.subscribe(2, b"AB", prefix=True) == [(SUBSCRIBE, b"AB", True)]
    assert f.subscribe(2, b"A", prefix=True) == []
    assert f.remove_peer(2) == [(UNSUBSCRIBE, b"AB", True)]
    assert f.unsubscribe(1, b"A", prefix=True) == [(UNSUBSCRIBE, b"A", True)]


def test_disconnect_is_minimal():
    # Peer 1 held "a" and "ab" (hidden under "a"); peer 2 holds "abc".
    f = Forwarder()
    f.subscribe(1, b"a", prefix=True)
    f.subscribe(1, b"ab", prefix=True)
    f.subscribe(2, b"abc")
    assert f.remove_peer(1) == [(SUBSCRIBE, b"abc", False), (UNSUBSCRIBE, b"a", True)]


def test_cap_collapses_and_expands():
    f = Forwarder(mode="subsume", cap=3, cap_low=1)
    for i in range(3):
        f.subscribe(1, b"k%d" % i)
    diff = f.subscribe(1, b"k3")
    assert diff[0] == (SUBSCRIBE, b"", True)                  # cover first...
    assert sorted(diff[1:]) == [(UNSUBSCRIBE, b"k%d" % i, False) for i in range(3)]  # ...then the rest
    assert f.collapsed and f.snapshot() == [(SUBSCRIBE, b"", True)]
    assert f.unsubscribe(1, b"k3") == [] and f.unsubscribe(1, b"k2") == []   # above cap_low
    diff = f.unsubscribe(1, b"k1")
    assert diff == [(SUBSCRIBE, b"k0", False), (UNSUBSCRIBE, b"", True)]
    assert not f.collapsed


def test_errors():
    f = Forwarder()
    with pytest.raises(NotSubscribedError):
        f.unsubscribe(1, b"never")
    with pytest.raises(ValueError, match="mode"):
        Forwarder(mode="fancy")
    with pytest.raises(ValueError, match="cap_low"):
        Forwarder(cap=4, cap_low=5)
    with pytest.raises(ValueError):
        Forwarder(cap=-1)


def test_apply_batches_events_and_keeps_the_partial_diff_on_error():
    f = Forwarder()
    events = [(SUBSCRIBE, 1, b"a", False), (SUBSCRIBE, 2, b"b", True), (UNSUBSCRIBE, 3, b"zz", False),
              (SUBSCRIBE, 4, b"c", False)]
    with pytest.raises(ForwarderError) as ei:
        f.apply(events)
    assert ei.value.index == 2
    assert ei.value.diff == [(SUBSCRIBE, b"a", False), (SUBSCRIBE, b"b", True)]
    assert isinstance(ei.value.__cause__, NotSubscribedError)
    assert f.apply([(SUBSCRIBE, 4, b"c", False), (UNSUBSCRIBE, 1, b"a", False)]) == [
        (SUBSCRIBE, b"c", False), (UNSUBSCRIBE, b"a", False)]
    assert f.peer_keys(2) == [(b"b", True, 1)]


@pytest.mark.parametrize("bad", [
    (SUBSCRIBE, -1, b"x", False),          # peer out of range
    (7, 1, b"x", False),                   # unknown op
    (SUBSCRIBE, 1, 12345, False),          # key of the wrong type
    (SUBSCRIBE, 1),                        # not a 4-tuple
])
def test_apply_malformed_event_keeps_the_partial_diff(bad):
    f = Forwarder()
    with pytest.raises(ForwarderError) as ei:
        f.apply([(SUBSCRIBE, 1, b"a", False), bad, (SUBSCRIBE, 2, b"never", False)])
    assert ei.value.index == 1
    assert ei.value.diff == [(SUBSCRIBE, b"a", False)]
    assert f.snapshot() == [(SUBSCRIBE, b"a", False)]     # the event after it was not applied


def test_apply_iterable_that_raises_keeps_the_partial_diff():
    def events():
        yield (SUBSCRIBE, 1, b"a", False)
        raise RuntimeError("source failed")

    f = Forwarder()
    with pytest.raises(ForwarderError) as ei:
        f.apply(events())
    assert ei.value.diff == [(SUBSCRIBE, b"a", False)] and ei.value.index == 1
    assert isinstance(ei.value.__cause__, RuntimeError)


# ---------------------------------------------------------------------------

ALPHABET = [b"a", b"b", b"\x00", b"\xff"]
keys_st = st.lists(st.sampled_from(ALPHABET), max_size=4).map(b"".join)
peers_st = st.integers(min_value=1, max_value=4)


def matches(key, prefix, topic):
    return topic.startswith(key) if prefix else topic == key


def wants(keyset, topic):
    return any(matches(k, p, topic) for k, p in keyset)


def minimal_upstream(mode, down):
    keys = set(down)
    if mode == "dedup":
        return keys
    return {(k, p) for k, p in keys
            if not any(cp and c != k and k.startswith(c) or (cp and c == k and not p)
                       for c, cp in keys)}


def probe_topics(keys):
    probes = {b""}
    for k, _p in keys:
        probes.add(k)
        for b in ALPHABET:
            probes.add(k + b)
        if k:
            probes.add(k[:-1])
    return probes


class ForwarderMachine(RuleBasedStateMachine):
    mode = "subsume"
    cap = 0
    cap_low = None

    def __init__(self):
        super().__init__()
        self.f = Forwarder(mode=self.mode, cap=self.cap, cap_low=self.cap_low)
        self.down = Counter()          # (peer, key, prefix) -> refs
        self.up = set()                # what upstream holds, from the diffs

    def downstream(self):
        return {(k, p) for (_peer, k, p), n in self.down.items() if n}

    def apply(self, diff, before, was_collapsed):
        after = self.downstream()
        probes = probe_topics(before | after | self.up)
        keep = {t for t in probes if wants(before, t) and wants(after, t)}
        u_before = set(self.up)
        for op, key, prefix in diff:
            if op == SUBSCRIBE:
                assert (key, prefix) not in self.up, f"redundant subscribe {key!r}"
                self.up.add((key, prefix))
            else:
                assert op == UNSUBSCRIBE
                assert (key, prefix) in self.up, f"unsubscribe of {key!r} not held"
                self.up.remove((key, prefix))
            for t in keep:           # never a gap for a topic wanted throughout
                assert wants(self.up, t), f"{t!r} filtered mid-diff"
        if self.f.collapsed:
            assert self.up == {(b"", True)}
        else:
            assert self.up == minimal_upstream(self.mode, after)
            if not was_collapsed:
                # no cap crossing: the diff is exactly the set change
                assert len(diff) == len(u_before ^ self.up)

    @rule(peer=peers_st, key=keys_st, prefix=st.booleans())
    def subscribe(self, peer, key, prefix):
        before = self.downstream()
        was = self.f.collapsed
        diff = self.f.subscribe(peer, key, prefix=prefix)
        self.down[peer, key, prefix] += 1
        self.apply(diff, before, was)

    @precondition(lambda self: any(self.down.values()))
    @rule(data=st.data())
    def unsubscribe(self, data):
        peer, key, prefix = data.draw(st.sampled_from(sorted(k for k, n in self.down.items() if n)))
        before = self.downstream()
        was = self.f.collapsed
        diff = self.f.unsubscribe(peer, key, prefix=prefix)
        self.down[peer, key, prefix] -= 1
        self.apply(diff, before, was)

    @rule(peer=peers_st)
    def remove_peer(self, peer):
        before = self.downstream()
        was = self.f.collapsed
        diff = self.f.remove_peer(peer)
        for k in list(self.down):
            if k[0] == peer:
                del self.down[k]
        self.apply(diff, before, was)

    @invariant()
    def upstream_matches_downstream(self):
        down = self.downstream()
        if not self.f.collapsed:
            for t in probe_topics(down | self.up):
                assert wants(self.up, t) == wants(down, t), t
        assert set((k, p) for _op, k, p in self.f.snapshot()) == self.up
        assert all(op == SUBSCRIBE for op, _k, _p in self.f.snapshot())
        assert self.f.upstream_count == len(minimal_upstream(self.mode, down))


def machine(mode, cap=0, cap_low=None):
    cls = type(f"Fwd_{mode}_{cap}_{cap_low}", (ForwarderMachine,),
               {"mode": mode, "cap": cap, "cap_low": cap_low})
    case = cls.TestCase
    case.settings = settings(max_examples=120, stateful_step_count=50, deadline=None)
    return case


TestDedup = machine("dedup")
TestSubsume = machine("subsume")
TestDedupCap = machine("dedup", cap=5, cap_low=3)
TestSubsumeCap = machine("subsume", cap=4, cap_low=2)
TestSubsumeCapNoHysteresis = machine("subsume", cap=3, cap_low=3)
