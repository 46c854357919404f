"""Boolean kernels on bit-sliced replicated shares (ABY3 / Araki et al. over GF(2)).

Boolean sharings use the grouped-plane layout of :class:`mpc3.shares.BShare`. Local gates
are plain bitwise operations on whole arrays; on the wire only ``ceil(n_g / 8)`` bytes per
plane and group are sent, so the byte counters report the real bit-packed size.

AND of replicated bits: ``z_i = x_i y_i ^ x_i y_{i+1} ^ x_{i+1} y_i ^ alpha_i`` (boolean zero
sharing), then ``z_i`` goes to party i-1. Cost: 1 round, 1 bit per AND per party.
"""
from __future__ import annotations

import numpy as np

from ..party import Party
from ..shares import BShare, group_sizes, words
from .. import ring
from .base import NEXT, PREV, Cost, Round, malformed, run_steps


def word_slices(sizes: list[int]) -> list[slice]:
    out, start = [], 0
    for n in sizes:
        out.append(slice(start, start + words(n)))
        start += words(n)
    return out


def pack_planes(planes: np.ndarray, n: int) -> np.ndarray:
    """(P, words(n)) uint64 -> (P, ceil(n/8)) uint8: the bytes that go on the wire, the
    padding bits past ``n`` zeroed (:func:`unpack_planes` refuses others)."""
    nb = (n + 7) // 8
    out = np.ascontiguousarray(planes).view(np.uint8).reshape(planes.shape[0], -1)[:, :nb].copy()
    if n % 8:
        out[:, -1] &= np.uint8((1 << (n % 8)) - 1)
    return out


def unpack_planes(buf: np.ndarray, n: int, src: tuple[Party, int]) -> np.ndarray:
    """Inverse of :func:`pack_planes` on the (P, ceil(n/8)) bytes party ``src[0]`` received
    from direction ``src[1]``; a wrong length or a set padding bit is refused naming the
    sender (:func:`base.malformed`)."""
    with malformed(src):
        if buf.ndim != 2 or buf.shape[1] != (n + 7) // 8:
            raise ring.NonCanonical(f"{buf.shape} bytes for bit planes of {n} bits")
        if n % 8:
            ring.check_padding(buf[:, -1], n)
    out = np.zeros((buf.shape[0], words(n) * 8), dtype=np.uint8)
    out[:, :buf.shape[1]] = buf
    return out.view(np.uint64)


def pack_grouped(planes: np.ndarray, sizes: list[int]) -> np.ndarray:
    return np.concatenate([pack_planes(planes[:, sl], n).reshape(-1)
                           for sl, n in zip(word_slices(sizes), sizes)])


def unpack_grouped(buf: np.ndarray, sizes: list[int], nplanes: int,
                   src: tuple[Party, int]) -> np.ndarray:
    parts, pos = [], 0
    with malformed(src):
        if buf.size != nplanes * sum((n + 7) // 8 for n in sizes):
            raise ring.NonCanonical(f"{buf.size} bytes for bit planes of groups {sizes}")
    for n in sizes:
        nb = (n + 7) // 8
        parts.append(unpack_planes(buf[pos:pos + nplanes * nb].reshape(nplanes, nb), n, src))
        pos += nplanes * nb
    return np.concatenate(parts, axis=1)


def random_planes(p: Party, stream: str, nplanes: int, nwords: int, tag: str) -> np.ndarray:
    raw = p.prg.bytes(stream, p.kop, tag, 8 * nplanes * nwords)
    return raw.view(np.uint64).reshape(nplanes, nwords)


def random_planes_many(p: Party, stream: str, nplanes: int, nwords: int, tags) -> list:
    """:func:`random_planes` for several tags of one stream (same values, one cipher call)."""
    raws = p.prg.bytes_many(stream, p.kop, [(t, 8 * nplanes * nwords) for t in tags])
    return [raw.view(np.uint64).reshape(nplanes, nwords) for raw in raws]


def and_local(p: Party, x: BShare, y: BShare, tag: str) -> np.ndarray:
    """This party's masked 3-out-of-3 share of x AND y (no communication)."""
    shape = x.a.shape
    alpha = random_planes(p, "next", *shape, tag) ^ random_planes(p, "prev", *shape, tag)
    return (x.a & y.a) ^ (x.a & y.b) ^ (x.b & y.a) ^ alpha


def reshare_bits(p: Party, z: np.ndarray, n: int) -> BShare:
    """3-out-of-3 (already masked) -> replicated: send z_i to party i-1."""
    return run_steps(p, reshare_bits_steps(p, z, n))[0]


def reshare_bits_steps(p: Party, z: np.ndarray, n: int):
    """:func:`reshare_bits` as one lockstep round (:func:`base.lockstep`)."""
    sizes = group_sizes(n)
    r = Round(p)
    r.send(PREV, pack_grouped(z, sizes))
    r.recv(NEXT, 0, 1)
    got = yield r
    return BShare(z, unpack_grouped(got[(NEXT, 0)][0], sizes, z.shape[0], (p, NEXT)), n)


def and_bb(p: Party, x: BShare, y: BShare, tag: str = "and") -> BShare:
    """Plane-wise AND of two grouped boolean sharings. Cost: :func:`cost_and_bb` (1 round,
    1 bit per AND and party, packed per element group)."""
    p.new_op()                              # fresh masks for every call
    return run_steps(p, and_steps(p, x, y, tag))[0]


def and_steps(p: Party, x: BShare, y: BShare, tag: str):
    """:func:`and_bb` as one lockstep round (:func:`base.lockstep`); in malicious mode the
    message's claim is registered (:meth:`mpc3.checks.Checks.and_product`)."""
    kop = p.kop
    out = yield from reshare_bits_steps(p, and_local(p, x, y, tag), x.n)
    if p.checks is not None:
        p.checks.and_product(p, x, y, out, tag, kop)
    return out


def cost_and_bb(n: int, cfg=None, planes: int = 1) -> Cost:
    return Cost.uniform(1, planes * sum((m + 7) // 8 for m in group_sizes(n)))

