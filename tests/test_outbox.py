"""The outbox: flush policy by count, size and age; nothing lost."""

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastbus import Outbox, decode


def test_due_by_count_size_and_age():
    box = Outbox(max_messages=3, max_bytes=0, max_delay=0.001)
    assert box.take() is None and not box.due() and box.deadline_ns() is None
    assert box.append(b"a", b"1", now_ns=1_000) is False
    assert box.deadline_ns() == 1_000 + 1_000_000
    assert not box.due(now_ns=1_000_999) and box.due(now_ns=1_001_000)   # by age of the oldest
    assert box.append(b"a", b"2", now_ns=900_000) is False
    assert box.deadline_ns() == 1_001_000                                  # still the oldest
    assert box.append(b"a", b"3", now_ns=900_001) is True                  # by count
    assert len(box) == 3
    assert decode(box.take()) == [(b"a", b"1"), (b"a", b"2"), (b"a", b"3")]
    assert len(box) == 0 and box.nbytes == 0

    big = Outbox(max_messages=0, max_bytes=100, max_delay=None)
    assert big.append(b"t", b"x" * 10) is False
    assert big.append(b"t", b"x" * 500) is True      # never dropped; due at once
    assert [len(p) for _t, p in decode(big.take())] == [10, 500]


def test_real_clock_age():
    box = Outbox(max_messages=0, max_bytes=0, max_delay=0.02)
    box.append(b"t", b"p")
    assert not box.due()
    time.sleep(0.03)
    assert box.due()


@given(st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=64)), max_size=200),
       st.integers(1, 50))
def test_nothing_lost_or_reordered(records, max_messages):
    box = Outbox(max_messages=max_messages, max_bytes=0, max_delay=None)
    out = []
    for topic, payload in records:
        if box.append(topic, payload):
            out.extend(decode(box.take()))
    rest = box.take()
    if rest is not None:
        out.extend(decode(rest))
    assert out == records


def test_extend_and_checksum():
    box = Outbox(max_messages=10, checksum=True)
    assert box.extend([(b"a", b"1"), ("b", "2")]) is False
    assert box.limits["checksum"] is True
    assert decode(box.take(), require_checksum=True) == [(b"a", b"1"), (b"b", b"2")]
    with pytest.raises(TypeError):
        box.extend([(b"a", 5)])
    box.clear()
    assert box.take() is None


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_messages"):
        Outbox(max_messages=-1)
    with pytest.raises(ValueError, match="max_delay"):
        Outbox(max_delay=-0.5)
    with pytest.raises(ValueError, match="max_delay"):
        Outbox(max_delay=float("nan"))


def test_publisher_wakes_once_per_batch_and_seals_full_batches():
    """Publisher wakes the sender when a batch starts and when it becomes
    due, not for every record; a full batch the sender has not taken is
    sealed, so batches stay at the limit and nothing is lost or reordered."""
    from fastbus._publisher import Publisher
    box = Outbox(max_messages=100, max_bytes=0, max_delay=None)
    wakes = []
    pub = Publisher(box, lambda: wakes.append(len(box)))
    for i in range(350):
        assert pub.publish(b"t", b"%d" % i) == 1
    assert wakes == [1, 100, 100, 100]
    assert pub.queued == 350
    got = []
    sizes = []
    while (item := pub.take(force=True)) is not None:
        batch, count = item
        records = decode(batch)
        assert len(records) == count
        sizes.append(count)
        got += [int(p) for _t, p in records]
    assert sizes == [100, 100, 100, 50]
    assert got == list(range(350))
    assert pub.queued == 0 and pub.buffered_bytes == 0


def test_publisher_blocks_at_its_buffer_limit():
    """With max_buffer_bytes set, publish waits once that much is buffered:
    PublishTimeout after block_timeout, the message not queued; a take() by
    the sender makes room and wakes a waiting publisher."""
    import threading

    from fastbus._publisher import Publisher

    from fastbus.errors import PublishTimeout
    box = Outbox(max_messages=10, max_bytes=0, max_delay=None)
    pub = Publisher(box, lambda: None, max_buffer_bytes=200, block_timeout=0.05,
                    block_reason=lambda: "nobody takes")
    n = 0
    with pytest.raises(PublishTimeout, match="nobody takes"):
        for n in range(1000):
            pub.publish(b"t", b"0123456789")
    assert 200 <= pub.buffered_bytes < 200 + 40
    assert pub.queued == n == pub.accepted       # the refused message was not queued
    pub.take()
    pub.publish(b"t", b"more")                   # room again: no block
    # A publisher waiting for room is woken by the sender's take().
    while pub.buffered_bytes < 200:
        pub.publish(b"t", b"0123456789")
    pub.block_timeout = 10
    done = threading.Event()
    t = threading.Thread(target=lambda: (pub.publish(b"t", b"waited"), done.set()))
    t.start()
    assert not done.wait(0.2)                    # blocked
    pub.take()
    assert done.wait(5)
    t.join()


def test_publisher_sends_inline_when_idle_and_leaves_bursts_to_the_sender():
    """With send_now, a batch that starts on an idle publisher is handed to
    send_now(False) in the publishing thread; once burst_limit batches left
    that way within burst_gap of each other, a starting batch wakes the
    sender instead; a full batch is always send_now(True); a send the
    sender made (sent(full=True)) marks the publisher busy."""
    from fastbus._publisher import Publisher
    box = Outbox(max_messages=3, max_bytes=0, max_delay=None)
    calls = []
    pub = Publisher(box, lambda: calls.append("wake"), burst_gap=10.0, burst_limit=2)

    def send_now(full):
        calls.append(("send", full))
        item = pub.take(force=True)
        assert item is not None
        pub.sent(full)

    pub.send_now = send_now
    assert pub.idle
    pub.publish(b"t", b"1")                  # idle: sent at once
    pub.publish(b"t", b"2")                  # second within the gap: still under the limit
    pub.publish(b"t", b"3")                  # third: a burst, the sender's
    pub.publish(b"t", b"4")
    pub.publish(b"t", b"5")                  # the batch is full: sent at once
    assert calls == [("send", False), ("send", False), "wake", ("send", True)]
    assert pub.queued == 0 and not pub.idle
    calls.clear()
    pub.publish(b"t", b"6")                  # busy after a full batch: the sender's
    assert calls == ["wake"]
    # With no gap, every starting batch is idle.
    box2 = Outbox(max_messages=100, max_bytes=0, max_delay=None)
    seen = []
    p2 = Publisher(box2, lambda: seen.append("wake"), send_now=lambda full: (seen.append(full), p2.take(True),
                                                                             p2.sent(full)),
                   burst_gap=0.0, burst_limit=1)
    for i in range(5):
        p2.publish(b"t", b"%d" % i)
    assert seen == [False] * 5


def test_publisher_put_back_keeps_order_and_accounting():
    from fastbus._publisher import Publisher
    box = Outbox(max_messages=2, max_bytes=0, max_delay=None)
    pub = Publisher(box, lambda: None)
    for i in range(5):
        pub.publish(b"t", b"%d" % i)
    first = pub.take()
    size = pub.buffered_bytes
    pub.put_back(*first)                     # could not be sent: first again
    assert pub.queued == 5 and pub.buffered_bytes == size + len(first[0])
    got = []
    while (item := pub.take(force=True)) is not None:
        got += [int(p) for _t, p in decode(item[0])]
    assert got == [0, 1, 2, 3, 4]


def test_publisher_argument_errors():
    from fastbus._publisher import Publisher
    box = Outbox()
    with pytest.raises(ValueError, match="burst_gap"):
        Publisher(box, lambda: None, burst_gap=-1)
    with pytest.raises(ValueError, match="burst_limit"):
        Publisher(box, lambda: None, burst_limit=-1)
    with pytest.raises(ValueError, match="max_buffer_bytes"):
        Publisher(box, lambda: None, max_buffer_bytes=-1)


def test_publisher_counts_what_it_queued_and_what_nobody_wanted():
    from fastbus import protocol as P
    from fastbus._publisher import Publisher
    pub = Publisher(Outbox(max_delay=None), lambda: None)
    assert pub.publish(b"a", b"1") == 1                 # no filter: queued
    pub.apply_want(P.WANT_RESET, P.encode_ops([(P.SUBSCRIBE, b"a", False)]))   # the broker's view
    assert pub.publish(b"b", b"2") == 0 and pub.publish(b"a", b"3") == 1
    assert (pub.accepted, pub.refused, pub.queued) == (2, 1, 2)
