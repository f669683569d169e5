"""The subscription trie: behaviour users rely on, then a model-based test
that drives it with random operation sequences against a plain Python model."""

import threading
from collections import Counter, defaultdict

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import fastbus
from fastbus import NotSubscribedError, Trie


def test_exact_and_prefix_keys():
    t = Trie()
    assert t.add(b"market.NYSE.1.trades", 1) is True
    assert t.add(b"market.NYSE.", 2, prefix=True) is True
    assert t.add(b"", 3, prefix=True) is True          # the empty prefix matches everything
    assert sorted(t.match(b"market.NYSE.1.trades")) == [1, 2, 3]
    assert sorted(t.match(b"market.NYSE.1.trade")) == [2, 3]   # exact needs equality
    assert sorted(t.match(b"market.NYSE.")) == [2, 3]           # a prefix matches itself
    assert t.match(b"market.LSE.1") == [3]
    assert t.any_match(b"anything") and not Trie().any_match(b"anything")


def test_each_subscriber_reported_once():
    t = Trie()
    for key, prefix in [(b"", True), (b"a", True), (b"ab", True), (b"abc", False), (b"abc", True)]:
        t.add(key, 7, prefix=prefix)
    assert t.match(b"abc") == [7]
    assert t.match_many([b"abc", b"ab", b"zz"]) == [[7], [7], [7]]


def test_reference_counts_and_first_last_reports():
    t = Trie()
    assert t.add(b"k", 1) is True
    assert t.add(b"k", 1) is False          # same subscriber again: a count, not a new key
    assert t.add(b"k", 2) is False
    assert t.refcount(b"k", 1) == 2 and t.holders(b"k") == 2
    assert t.remove(b"k", 1) is False
    assert t.remove(b"k", 1) is False       # subscriber 2 still holds it
    assert t.remove(b"k", 2) is True        # the last holder went
    assert len(t) == 0


def test_removing_what_was_never_added_is_an_error_and_changes_nothing():
    t = Trie()
    t.add(b"k", 1)
    with pytest.raises(NotSubscribedError) as ei:
        t.remove(b"k", 2)
    assert isinstance(ei.value, KeyError) and "does not hold" in str(ei.value)
    with pytest.raises(KeyError):
        t.remove(b"k", 1, prefix=True)      # the other kind is another key
    with pytest.raises(KeyError):
        t.remove(b"nope", 1)
    assert t.match(b"k") == [1]
    t.check()


def test_binary_keys_nul_and_ff():
    t = Trie()
    k = b"\x00\xff\x00a"
    t.add(k, 1)
    t.add(k[:2], 2, prefix=True)
    assert sorted(t.match(k)) == [1, 2]
    assert t.match(b"\x00\xff") == [2]
    assert t.match(b"\x00") == []
    assert t.keys() == [(b"\x00\xff", True, 1), (k, False, 1)]


def test_argument_types():
    t = Trie()
    t.add("café", 1)                                 # str is UTF-8
    assert t.match("café".encode()) == [1]
    assert t.match(bytearray("café".encode())) == [1]
    assert t.match(memoryview("café".encode())) == [1]
    with pytest.raises(TypeError, match="expected bytes"):
        t.add(123, 1)
    with pytest.raises(OverflowError):
        t.add(b"k", -1)
    with pytest.raises(OverflowError):
        t.add(b"k", 2 ** 64)
    t.add(b"k", 2 ** 64 - 1)                         # the whole id range works
    assert t.match(b"k") == [2 ** 64 - 1]


def test_remove_subscriber_reports_keys_that_lost_their_last_holder():
    t = Trie()
    t.add(b"a", 1)
    t.add(b"b", 1, prefix=True)
    t.add(b"b", 1, prefix=True)                      # counts do not matter here
    t.add(b"a", 2)
    gone = t.remove_subscriber(1)
    assert gone == [(b"b", True)]                    # b"a" is still held by 2
    assert t.remove_subscriber(1) == []              # unknown subscriber: nothing to do
    assert t.match(b"a") == [2]
    assert t.stats()["subscribers"] == 1


def test_long_keys_do_not_overflow_the_stack():
    t = Trie()
    big = b"x" * (1 << 20)
    t.add(big, 1)
    t.add(big[:-1], 2, prefix=True)
    for i in range(1, 3000):                         # a 3000-deep chain of nested prefixes
        t.add(big[:i], 3, prefix=True)
    assert sorted(t.match(big)) == [1, 2, 3]
    assert len(t.keys()) == 3001
    assert len(t.remove_subscriber(3)) == 2999
    t.check()


def test_match_flat_is_match_many():
    t = Trie()
    for i in range(200):
        t.add(f"k{i % 37}".encode(), i)
    t.add(b"k1", 999, prefix=True)
    topics = [f"k{i}".encode() for i in range(100)] + [b"", b"k"]
    many = t.match_many(topics)
    offsets, ids = t.match_flat(topics)
    assert len(offsets) == len(topics) + 1
    assert [sorted(ids[offsets[i]:offsets[i + 1]]) for i in range(len(topics))] == [sorted(m) for m in many]
    assert [sorted(m) for m in many] == [sorted(t.match(x)) for x in topics]
    assert t.match_many([]) == [] and list(t.match_flat([])[0]) == [0]


def test_covered():
    t = Trie()
    t.add(b"ab", 1, prefix=True)
    assert t.covered(b"abc") and t.covered(b"ab") and t.covered(b"abc", prefix=True)
    assert not t.covered(b"ab", prefix=True)          # a key does not cover itself
    assert not t.covered(b"a")


def test_stats_and_memory_accounting():
    t = Trie()
    for i in range(1000):
        t.add(f"market.NYSE.{i:05d}.trades".encode(), i % 10)
    s = t.stats()
    assert s["keys"] == 1000 and s["subscriptions"] == 1000 and s["subscribers"] == 10
    assert 0 < s["bytes_live"] <= s["bytes_reserved"]
    assert s["bytes_reserved"] < 1000 * 400          # a small table stays small
    for i in range(10):
        t.remove_subscriber(i)
    s = t.stats()
    assert s["keys"] == 0 and s["subscribers"] == 0 and s["nodes"] == 1


def test_concurrent_threads():
    """Threads share one trie: batch calls release the GIL, every call holds
    the trie's lock, so the result is as if the calls ran one at a time."""
    t = Trie()
    keys = [f"t.{i}".encode() for i in range(500)]
    errors = []

    def writer(sub):
        try:
            for _ in range(20):
                for k in keys:
                    t.add(k, sub)
                for k in keys:
                    t.remove(k, sub)
            for k in keys:
                t.add(k, sub)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader():
        try:
            for _ in range(200):
                for subs in t.match_many(keys):
                    assert len(subs) == len(set(subs))
        except Exception as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(3)] + [
        threading.Thread(target=reader) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert all(sorted(m) == [0, 1, 2] for m in t.match_many(keys))
    t.check()


# ---------------------------------------------------------------------------
# Model-based test: random add / remove / remove_subscriber / match sequences
# against a dict of reference counts.  Keys come from a tiny alphabet (with
# NUL and 0xff) so that splits, merges and shared prefixes happen constantly.

ALPHABET = [b"a", b"b", b"\x00", b"\xff"]
keys_st = st.lists(st.sampled_from(ALPHABET), max_size=6).map(b"".join)
subs_st = st.integers(min_value=0, max_value=5).map(lambda i: i * 0x100000001)


def model_match(model, topic):
    return {sub for (key, prefix, sub), n in model.items()
            if n and (topic.startswith(key) if prefix else topic == key)}


class TrieMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.t = Trie()
        self.model = Counter()   # (key, prefix, sub) -> refcount

    def holders(self, key, prefix):
        return sum(1 for (k, p, _s), n in self.model.items() if n and k == key and p == prefix)

    @rule(key=keys_st, prefix=st.booleans(), sub=subs_st)
    def add(self, key, prefix, sub):
        first = self.holders(key, prefix) == 0
        assert self.t.add(key, sub, prefix=prefix) is first
        self.model[key, prefix, sub] += 1

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def remove_held(self, data):
        held = sorted(k for k, n in self.model.items() if n)
        key, prefix, sub = data.draw(st.sampled_from(held))
        last = self.model[key, prefix, sub] == 1 and self.holders(key, prefix) == 1
        assert self.t.remove(key, sub, prefix=prefix) is last
        self.model[key, prefix, sub] -= 1

    @rule(key=keys_st, prefix=st.booleans(), sub=subs_st)
    def remove_maybe_absent(self, key, prefix, sub):
        if self.model[key, prefix, sub]:
            self.t.remove(key, sub, prefix=prefix)
            self.model[key, prefix, sub] -= 1
        else:
            with pytest.raises(NotSubscribedError):
                self.t.remove(key, sub, prefix=prefix)

    @rule(sub=subs_st)
    def remove_subscriber(self, sub):
        mine = {(k, p) for (k, p, s), n in self.model.items() if n and s == sub}
        expect_gone = {(k, p) for (k, p) in mine if self.holders(k, p) == 1}
        gone = self.t.remove_subscriber(sub)
        assert len(gone) == len(set(gone))
        assert set(gone) == expect_gone
        for k in list(self.model):
            if k[2] == sub:
                del self.model[k]

    @rule(topic=keys_st)
    def match(self, topic):
        got = self.t.match(topic)
        assert len(got) == len(set(got))
        assert set(got) == model_match(self.model, topic)
        assert self.t.any_match(topic) == bool(got)

    @rule(topics=st.lists(keys_st, max_size=20))
    def match_many(self, topics):
        assert [set(m) for m in self.t.match_many(topics)] == [model_match(self.model, x) for x in topics]

    @invariant()
    def consistent(self):
        self.t.check()
        live = {k: n for k, n in self.model.items() if n}
        s = self.t.stats()
        assert s["subscriptions"] == len(live)
        assert s["subscribers"] == len({sub for (_k, _p, sub) in live})
        per_key = defaultdict(int)
        for (k, p, _s) in live:
            per_key[k, p] += 1
        assert {(k, p): h for (k, p, h) in self.t.keys()} == dict(per_key)


TestTrieModel = TrieMachine.TestCase
TestTrieModel.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


@given(st.lists(st.tuples(keys_st, st.booleans(), subs_st), max_size=60), keys_st)
def test_keys_walk_prefix(entries, prefix):
    t = Trie()
    for key, is_prefix, sub in entries:
        t.add(key, sub, prefix=is_prefix)
    listed = t.keys(prefix)
    assert [k for k, _p, _h in listed] == sorted(k for k, _p, _h in listed)
    assert {(k, p) for k, p, _h in listed} == {(k, p) for k, p, _s in entries if k.startswith(prefix)}
