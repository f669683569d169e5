"""The batch format: round trips, and every truncation or corruption of a
valid batch rejected cleanly (see docs/BATCH_FORMAT.md)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastbus
from fastbus import BatchError, batch_count, crc32c, decode, encode

records_st = st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=300)), max_size=30)


@given(records_st, st.booleans())
def test_round_trip(records, checksum):
    b = encode(records, checksum=checksum)
    assert decode(b) == records
    assert b.count == len(records) == batch_count(b)
    assert decode(bytes(b), require_checksum=checksum) == records


#: Records with and without headers, mixed as a publisher mixes them:
#: names of any text (UTF-8 on the wire), values str or bytes.
headers_st = st.dictionaries(st.text(min_size=1, max_size=12).filter(lambda k: k[0] != ":"),   # (':' is the protocol's)
                             st.binary(max_size=60) | st.text(max_size=20), max_size=5)
hrecords_st = st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=100)) |
                       st.tuples(st.binary(max_size=40), st.binary(max_size=100), headers_st), max_size=30)


def _as_decoded(rec: tuple) -> tuple:
    """What decode() gives back for an encoded record: bytes values, and a
    third item only for a record that has headers."""
    if len(rec) == 2 or not rec[2]:
        return rec[:2]
    return rec[0], rec[1], {k: v.encode() if isinstance(v, str) else v for k, v in rec[2].items()}


@given(hrecords_st, st.booleans())
def test_round_trip_with_headers(records, checksum):
    b = encode(records, checksum=checksum)
    want = [_as_decoded(r) for r in records]
    assert decode(b) == want
    assert decode(b, headers=False) == [r[:2] for r in records]
    assert decode(b, headers=True) == [(r[0], r[1], r[2] if len(r) == 3 else None) for r in want]
    assert bool(bytes(b)[3] & fastbus.BATCH_F_HEADERS) == any(len(r) == 3 for r in want)


#: A stream's records mostly repeat their headers: records drawn from a
#: few header mappings (None among them), so runs of the same one occur.
repeated_st = st.lists(headers_st | st.none(), min_size=1, max_size=3).flatmap(
    lambda pool: st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=40), st.sampled_from(pool)),
                          max_size=30))


@given(repeated_st, st.booleans())
def test_header_repeats_round_trip(records, checksum):
    """A batch with repeats (flag bit 2) decodes to what the same records
    without them do, is never longer, and says so exactly where a record
    carries the non-empty headers of the one before; a record that repeats
    the headers of the one before shares its Headers, which nobody can
    change (so sharing cannot leak a change from one message to another)."""
    plain = bytes(encode(records, checksum=checksum))
    again = bytes(encode(records, checksum=checksum, header_repeats=True))
    assert decode(again) == decode(plain) == [_as_decoded(r) for r in records]
    assert len(again) <= len(plain)
    blocks = [list(_as_decoded(r)[2].items()) if len(_as_decoded(r)) == 3 else None for r in records]
    repeats = any(b is not None and b == blocks[i - 1] for i, b in enumerate(blocks) if i)   # (the same bytes)
    assert bool(again[3] & fastbus.BATCH_F_HEADERS_AGAIN) == repeats
    assert not plain[3] & fastbus.BATCH_F_HEADERS_AGAIN
    decoded = decode(again)
    for i, r in enumerate(decoded):
        if len(r) == 3:
            assert type(r[2]) is fastbus.Headers
            if i and blocks[i] == blocks[i - 1]:
                assert r[2] is decoded[i - 1][2]
            with pytest.raises(TypeError, match="read-only"):
                r[2]["mine"] = b"changed"
            with pytest.raises(TypeError, match="read-only"):
                r[2].update(mine=b"changed")
            assert "mine" not in r[2]
            mine = dict(r[2])
            mine["mine"] = b"changed"             # (a copy is a plain dict to change)
            assert "mine" not in r[2]


def test_received_headers_are_read_only_and_behave_as_a_dict():
    """Every way to change a Headers raises; reading, comparing, copying,
    pickling, JSON and sending it on work as they do for a dict."""
    import copy
    import json
    import pickle
    h = decode(encode([(b"t", b"a", {"k": "v", "bin": b"\xff"})]))[0][2]
    want = {"k": b"v", "bin": b"\xff"}
    changes = [lambda: h.__setitem__("x", b"1"), lambda: h.__delitem__("k"), lambda: h.clear(),
               lambda: h.pop("k"), lambda: h.pop("nope", None), lambda: h.popitem(), lambda: h.setdefault("x", b"1"),
               lambda: h.update(x=b"1"), lambda: h.update({"x": b"1"}), lambda: h.__init__(x=b"1"),
               lambda: h.__ior__({"x": b"1"})]
    for change in changes:
        with pytest.raises(TypeError, match="read-only"):
            change()
    assert h == want and isinstance(h, dict) and len(h) == 2 and h.get("k") == b"v" and list(h) == ["k", "bin"]
    assert type(h.copy()) is dict and h.copy() == want and type(h | {"x": b"1"}) is dict
    assert copy.copy(h) is h and copy.deepcopy(h) is h
    back = pickle.loads(pickle.dumps(h))
    assert type(back) is fastbus.Headers and back == want
    assert json.loads(json.dumps(fastbus.Headers(k="v"))) == {"k": "v"}
    assert decode(encode([(b"t", b"b", h)]))[0][2] == want        # (sent on as it came)
    assert fastbus.Headers() == {} and fastbus.Headers({"a": "1"}, b="2") == {"a": "1", "b": "2"}


def test_a_repeat_in_a_batch_without_the_flag_is_refused():
    """flag bit 2 cleared by hand: a 1-byte block is not a block."""
    data = bytearray(encode([(b"t", b"a", {"k": "v"}), (b"t", b"b", {"k": "v"})], header_repeats=True))
    assert data[3] & fastbus.BATCH_F_HEADERS_AGAIN
    data[3] &= ~fastbus.BATCH_F_HEADERS_AGAIN
    with pytest.raises(BatchError):
        decode(bytes(data))

def test_large_records_round_trip():
    records = [(b"t" * 70_000, b"\x00\xff" * 3_000_000), (b"", b"")]   # 64 KiB+ topic, 6 MB payload
    assert decode(encode(records, checksum=True)) == records


@given(st.lists(st.tuples(st.binary(max_size=10), st.binary(max_size=40)), min_size=1, max_size=8),
       st.booleans())
def test_every_truncation_is_rejected(records, checksum):
    data = bytes(encode(records, checksum=checksum))
    for cut in range(len(data)):
        with pytest.raises(BatchError) as ei:
            decode(data[:cut])
        assert ei.value.reason in ("truncated", "checksum", "malformed")


def test_every_single_byte_corruption_is_rejected_with_checksum():
    records = [(b"market.NYSE.%05d.trades" % i, b"x" * (i * 7)) for i in range(12)]
    data = bytearray(encode(records, checksum=True))
    for pos in range(len(data)):
        for delta in (1, 0x80, 0xFF):
            bad = bytearray(data)
            bad[pos] = (bad[pos] + delta) & 0xFF
            with pytest.raises(BatchError):
                decode(bytes(bad))


@given(st.binary(max_size=200))
def test_garbage_never_crashes(data):
    try:
        out = decode(data)
    except BatchError as exc:
        assert exc.reason in ("malformed", "truncated", "version", "limit", "checksum")
    else:
        assert isinstance(out, list)


@given(hrecords_st, st.data())
def test_corruption_without_checksum_is_rejected_or_stays_in_bounds(records, data):
    """(Records with and without headers.)"""
    raw = bytearray(encode(records))
    if not raw:
        return
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] = data.draw(st.integers(0, 255))
    try:
        out = decode(bytes(raw))
    except BatchError:
        return
    assert sum(len(r[0]) + len(r[1]) + sum(len(k.encode("utf-8", "surrogateescape")) + len(v)
                                            for k, v in (r[2] if len(r) == 3 else {}).items())
               for r in out) <= len(raw)


def test_hostile_headers():
    with pytest.raises(BatchError, match="malformed"):
        decode(b"XB\x01\x00\x00\x00\x00\x00")
    with pytest.raises(BatchError) as ei:
        decode(b"FB\x02\x00\x00\x00\x00\x00")
    assert ei.value.reason == "version"
    with pytest.raises(BatchError) as ei:
        decode(b"FB\x01\x80\x00\x00\x00\x00")            # unknown flag bit
    assert ei.value.reason == "version"
    # A count of 4 billion records in a 10-byte buffer: rejected without allocating for it.
    with pytest.raises(BatchError, match="truncated"):
        decode(b"FB\x01\x00\xff\xff\xff\xff\x00\x00")
    # Non-minimal varint, 5-byte varint over 32 bits, trailing bytes.
    with pytest.raises(BatchError, match="malformed"):
        decode(b"FB\x01\x00\x01\x00\x00\x00\x80\x00\x00")
    with pytest.raises(BatchError, match="malformed"):
        decode(b"FB\x01\x00\x01\x00\x00\x00\xff\xff\xff\xff\x1f\x00")
    with pytest.raises(BatchError, match="malformed"):
        decode(b"FB\x01\x00\x01\x00\x00\x00\x01\x01ab!")
    with pytest.raises(TypeError):
        decode("not bytes")


def test_decoder_limits():
    b = encode([(b"topic", b"x" * 100)] * 3)
    assert len(decode(b, max_topic=5, max_payload=100, max_records=3)) == 3
    for kwargs in ({"max_topic": 4}, {"max_payload": 99}, {"max_records": 2}):
        with pytest.raises(BatchError) as ei:
            decode(b, **kwargs)
        assert ei.value.reason == "limit"
    with pytest.raises(BatchError) as ei:
        decode(b, require_checksum=True)
    assert ei.value.reason == "checksum"


def test_batch_is_a_zero_copy_buffer():
    box = fastbus.Outbox()
    box.append(b"t", b"payload")
    b = box.take()
    view = memoryview(b)
    assert view.obj is b and view.readonly and bytes(view) == bytes(b)
    assert len(b) == len(bytes(b)) and b.records() == [(b"t", b"payload")]
    del view
    with pytest.raises(TypeError):
        fastbus.Batch()


def test_empty_batch_and_crc():
    assert decode(encode([])) == [] and decode(encode([], checksum=True)) == []
    assert bytes(encode([])) == b"FB\x01\x00\x00\x00\x00\x00"            # the core's fb_batch_empty
    sealed = encode([], checksum=True)
    assert len(sealed) == 12 and decode(sealed, require_checksum=True) == []
    assert crc32c(b"123456789") == 0xE3069283                 # the CRC-32C check value
    assert crc32c(b"56789", crc32c(b"1234")) == 0xE3069283



def test_headers_changed_in_place_are_encoded_anew():
    """The encoder hands back the block it made last only for a dict of the
    very same objects: one changed in place between two publishes (a value
    replaced, a header added, one removed) is encoded as it is now."""
    h = {"content-type": "application/json", "k": b"v"}
    seen = []
    for change in (lambda d: None, lambda d: None, lambda d: d.__setitem__("k", b"w"),
                   lambda d: d.__setitem__("x", "1"), lambda d: d.pop("content-type")):
        change(h)
        seen.append(decode(encode([(b"t", b"p", h)]))[0][2])
    ct = b"application/json"
    assert seen == [{"content-type": ct, "k": b"v"}, {"content-type": ct, "k": b"v"}, {"content-type": ct, "k": b"w"},
                    {"content-type": ct, "k": b"w", "x": b"1"}, {"k": b"w", "x": b"1"}]
