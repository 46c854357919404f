"""The peer-link message codec: what a sender frames, a receiver gets back; bad headers are
refused before any buffer is allocated for them."""
import numpy as np
import pytest

from mpc3.comm import ProtocolError
from net.peer import frames
from net import grpcopts
from net.proto import mpc3_pb2 as pb


def _roundtrip(arrays):
    wire = [pb.PeerFrame.FromString(f.SerializeToString())
            for f in frames.frames_of("job", 7, arrays)]
    head = wire[0]
    assert all(f.job_id == "job" and f.op == 7 for f in wire)
    assert [f.more for f in wire] == [True] * (len(wire) - 1) + [False]
    if not arrays:
        assert head.n_arrays == 0 and len(wire) == 1
        return [], wire
    layout, size = frames.parse_layout(head.layout, head.n_arrays)
    buf = bytearray(b"".join(f.data for f in wire))
    return frames.split(buf, layout, size), wire


def test_arrays_come_back_with_dtype_shape_and_bytes():
    sent = [np.arange(6, dtype=np.uint64).reshape(2, 3), np.zeros((0, 4), np.int16),
            np.arange(5, dtype=np.uint8), np.array(2**63 + 5, dtype=np.uint64),
            np.arange(12, dtype=np.uint64).reshape(3, 4).T]      # not contiguous
    got, wire = _roundtrip(sent)
    assert len(wire) == 1
    for a, b in zip(sent, got):
        assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
        assert b.flags.writeable
    assert _roundtrip([])[0] == []


def test_large_message_is_chunked_and_reassembled():
    big = np.arange((grpcopts.CHUNK_BYTES // 8) * 2 + 3, dtype=np.uint64)
    got, wire = _roundtrip([big, np.zeros((0, 2), np.int16)])
    assert len(wire) == 3 and all(len(f.data) <= grpcopts.CHUNK_BYTES for f in wire)
    assert not wire[1].layout and wire[1].n_arrays == 0
    assert (got[0] == big).all() and got[1].shape == (0, 2)


@pytest.mark.parametrize("header, n, match", [
    (b"<u8:3", 2, "lists 1 arrays"),
    (b"<f8:3", 1, "unexpected dtype"),
    (b"|b1:3", 1, "unexpected dtype"),
    (b"<u8:3,-1", 1, "invalid shape"),
    (b"<u8:x", 1, "malformed"),
    (b"nonsense:3", 1, "malformed"),
    (b"<u8:" + b",".join([b"1"] * 40), 1, "invalid shape"),
    (b"<u8:4294967296,4294967296", 1, "longer than"),
    (b"\xff:1", 1, "malformed"),
    (b";".join([b"<u8:1"] * 20000), 20000, "header of"),
])
def test_bad_headers_are_refused(header, n, match):
    with pytest.raises(ProtocolError, match=match):
        frames.parse_layout(header, n)


def test_long_headers_are_parsed_without_caching():
    n = 200                                     # > _CACHED_HEADER_BYTES, < MAX_HEADER_BYTES
    header = b";".join([b"<u8:1,1"] * n)
    assert len(header) > frames._CACHED_HEADER_BYTES
    before = frames._parse_cached.cache_info().currsize
    layout, size = frames.parse_layout(header, n)
    assert len(layout) == n and size == 8 * n
    assert frames._parse_cached.cache_info().currsize == before


def test_byte_count_must_match_the_header():
    layout, size = frames.parse_layout(b"<u8:3;|u1:2", 2)
    assert size == 26
    with pytest.raises(ProtocolError, match="announces 26"):
        frames.split(bytearray(25), layout, size)
