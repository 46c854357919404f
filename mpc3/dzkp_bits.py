"""Distributed zero-knowledge proofs of mod-2 gates over GF(2^64): the boolean circuits' claims.

The statement. A batch of L gates ``XOR_a u[a, j] v[a, j] == z[j]`` over GF(2) (j < L,
a < m) that the prover knows whole and whose verifiers hold one side each: V_L = P_{i-1}
every u and a share z_L, V_R = P_{i+1} every v and z_R, z = z_L ^ z_R. An AND layer's
message (:func:`mpc3.claims.and_bit_claims`) is such a gate of two terms. The gates are held
packed, 64 to a word (:class:`BitClaim`).

Why a field of characteristic 2. The same gates proven over Z_2^64 (:mod:`mpc3.dzkp`) must
live in the Galois ring: the integer form of an AND gate has four terms, every term a word,
and the first fold leaves 64 words an element. Over GF(2^64) a term is a bit, an element of
the folded vectors one word, and a false gate's error is the field's 1: the random linear
combination misses it with probability 1 / 2^64, so one repetition does.

The proof is :mod:`mpc3.dzkp`'s (Boyle-Gilboa-Ishai-Nof, CCS 2019), with the field in place
of the ring:

1. V_L and V_R both send the prover a seed of the key they share (it aborts if they
   differ: :class:`SeedMismatch`). Gate (i, t) (chunk i of k1,
   position t) gets the weight theta_i sigma_t, both uniform in the field; the claim is
   ``sum_i theta_i sum_t sigma_t z_(i,t)``, each verifier's share computed from its z share.
2. The prover sends (XOR-shared: V_L's share from their key, V_R's sent) h at 2 k1 - 1
   nodes, h(X) = sum_(a,t) sigma_t p_(a,t)(X) q_(a,t)(X), p and q interpolating the k1
   chunks' bits. Its values at the other nodes need only the Gram sums
   ``sum_t sigma_t (u_(a,i,t) v_(a,i',t) + u_(a,i',t) v_(a,i,t))``: over 64 positions at
   once that is a word of ANDs and XORs whose set bits select the sigmas, summed with eight
   byte-table lookups (:func:`_gram_bits`). The verifiers check ``sum_i theta_i h(w_i)``
   against the claim and send a random point r; each folds its side (:func:`_fold_bits`: a
   64 x 64 bit transpose and eight lookups an element), u's weighted by sigma_t.
3. Then compressions by k over field vectors (:func:`mpc3.gf2k.gram`, :func:`mpc3.gf2k.fold`)
   until at most k elements remain; the prover pads p and q with a random value each, sends
   h, and the verifiers open p(r), q(r), h(r) and every check to each other.

Rounds: 2 per compression plus the first seed and the openings - no verdict round of its own:
:func:`verify_bits` returns this party's two verdicts, which :func:`mpc3.dzkp.verify_claims`
sends with its own. Soundness: :func:`soundness_bits`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from . import gf2k
from .comm import one_array
from .party import Party
from .dzkp import _words
from .dzkp_rounds import challenge_seeds
from .ringmm import once

#: chunks of the first compression (one bit of a word each: the fold's transpose) and of
#: the later ones
K_FIRST, K = 64, 16
#: nodes are the integers 0 .. 2 K_FIRST; challenges avoid them
AVOID = 2 * max(K_FIRST, K) + 1


@dataclass
class BitClaim:
    """One party's view of one prover's batch of mod-2 gates, packed: u, v (m, W) uint64,
    bit t of word w the gate 64 w + t; z (W,). Whole for the prover; V_L holds u and its z
    share (v None), V_R v and its share (u None). Bits past the batch's gates are zero."""

    u: np.ndarray | None
    v: np.ndarray | None
    z: np.ndarray

    def __post_init__(self) -> None:
        given = [x for x in (self.u, self.v) if x is not None]
        if not given or any(x.ndim != 2 or x.shape != given[0].shape for x in given) \
                or self.z.shape != given[0].shape[1:] \
                or any(x.dtype != np.uint64 for x in (*given, self.z)):
            raise ValueError("bit claim: u, v (m, W) and z (W,) uint64 words")

    @property
    def width(self) -> int:
        """m: the terms of each gate."""
        return (self.u if self.u is not None else self.v).shape[0]

    @property
    def words(self) -> int:
        return self.z.size

    @property
    def terms(self) -> int:
        """m 64 W: the gate terms of the batch, its padding bits included."""
        return 64 * (self.u if self.u is not None else self.v).size


def pack(rows: np.ndarray) -> np.ndarray:
    """(r, L) 0/1 (any integer dtype) -> (r, words(L)) uint64 packed bits, bit t of word w the
    element 64 w + t."""
    rows = np.atleast_2d(rows)
    packed = np.packbits(rows.astype(bool, copy=False), axis=1, bitorder="little")
    out = np.zeros((rows.shape[0], -(-rows.shape[1] // 64) * 8), dtype=np.uint8)
    out[:, :packed.shape[1]] = packed
    return out.view(np.uint64)


# ------------------------------------------------------------------ public costs ------
def _lengths(batches: list[tuple[int, int]]) -> list[int]:
    """Vector lengths entering each compression: the bit words' positions, then the
    field vectors' (m n elements a batch of m terms, n positions a chunk)."""
    live = [(w, m) for w, m in batches if w]
    if not live:
        return []
    out = [sum(64 * w for w, _ in live)]
    n = sum(m * 64 * -(-w // K_FIRST) for w, m in live)
    while n > K:
        out.append(n)
        n = -(-n // K)
    out.append(n)
    return out


def soundness_bits(batches: list[tuple[int, int]]) -> float:
    """-log2 of the probability that a false batch passes, for batches of (words, terms):
    2 / 2^64 for the weights (a bilinear form in theta and sigma), (2k - 2) / (2^64 - AVOID)
    per compression (k1 for the first) and 2 k' / (2^64 - AVOID) for the last."""
    steps = _lengths(batches)
    if not steps:
        return math.inf
    g = 2.0 ** 64
    eps = 2 / g + ((2 * K_FIRST - 2) + (len(steps) - 2) * (2 * K - 2) + 2 * steps[-1]) \
        / (g - AVOID)
    return -math.log2(eps)


def cost_verify_bits(batches: list[tuple[int, int]]) -> tuple[int, int]:
    """(rounds, bytes each party sends) of :func:`verify_bits` for batches of (words,
    terms); its verdicts travel with :func:`mpc3.dzkp.verify_claims`'s."""
    steps = _lengths(batches)
    if not steps:
        return 0, 0
    S = len(steps)
    bytes_ = 2 * 16 * S                 # challenge seeds: to the prover from both verifiers
    bytes_ += 8 * ((2 * K_FIRST - 1) + (S - 2) * (2 * K - 1))        # each h
    bytes_ += 8 * (2 * steps[-1] + 1 + 2)               # the last h and the pads
    bytes_ += 2 * 8 * (S + 3)                           # checks, p(r), q(r), h(r) both ways
    return 2 * S + 1, bytes_


# ------------------------------------------------------------------ kernels ----------
def _transpose64(a):  # pragma: no cover - compiled
    """In place: afterwards bit i of a[t] is the former bit t of a[i]."""
    j = 32
    m = np.uint64(0x00000000FFFFFFFF)
    while j:
        k = 0
        while k < 64:
            t = ((a[k] >> np.uint64(j)) ^ a[k + j]) & m
            a[k] ^= t << np.uint64(j)
            a[k + j] ^= t
            k = (k + j + 1) & ~j
        j >>= 1
        m ^= m << np.uint64(j)


def _gram_bits(U, V, sig, k, nw, w0, w1, out, tab):  # pragma: no cover
    """out[p] ^= sum over positions t of words w0 .. w1 - 1 of each chunk of sig[t] times
    the bit t of XOR_a (U_a,i & V_a,i') ^ (U_a,i' & V_a,i) (U_a,i & V_a,i on the diagonal),
    for the pairs p = (i <= i'); chunk i of U, V (m, W) is words i nw .. (i + 1) nw - 1."""
    m, W = U.shape
    a = np.zeros((k, m), dtype=np.uint64)
    b = np.zeros((k, m), dtype=np.uint64)
    for w in range(w0, w1):
        _subset_table_jit(sig[64 * w:64 * w + 64], tab)
        for i in range(k):
            idx = i * nw + w
            for r in range(m):
                a[i, r] = U[r, idx] if idx < W else np.uint64(0)
                b[i, r] = V[r, idx] if idx < W else np.uint64(0)
        p = 0
        for i in range(k):
            for i2 in range(i, k):
                c = np.uint64(0)
                if i2 == i:
                    for r in range(m):
                        c ^= a[i, r] & b[i, r]
                else:
                    for r in range(m):
                        c ^= (a[i, r] & b[i2, r]) ^ (a[i2, r] & b[i, r])
                if c:
                    out[p] ^= _lookup_jit(tab, c)
                p += 1


def _weighted_sums(z, sig, k, nw, out, tab):  # pragma: no cover
    """out[i] = sum_t sig[t] z_(i,t) for the k chunks of z (W,) of nw words."""
    W = z.size
    for w in range(nw):
        _subset_table_jit(sig[64 * w:64 * w + 64], tab)
        for i in range(k):
            idx = i * nw + w
            if idx < W and z[idx]:
                out[i] ^= _lookup_jit(tab, z[idx])


def _fold_bits(X, k, nw, tab, out):  # pragma: no cover
    """out[r, 64 w + t] = sum_i L_i bit t of X[r, i nw + w] (tab: the L_i's byte tables)."""
    m, W = X.shape
    blk = np.zeros(64, dtype=np.uint64)
    for r in range(m):
        for w in range(nw):
            for i in range(64):
                idx = i * nw + w
                blk[i] = X[r, idx] if i < k and idx < W else np.uint64(0)
            _transpose64_jit(blk)
            for t in range(64):
                out[r, 64 * w + t] = _lookup_jit(tab, blk[t])


_transpose64_jit = _transpose64
_lookup_jit = gf2k._lookup
_subset_table_jit = gf2k._subset_table


@once
def _kernels() -> dict:
    import numba

    kern = gf2k._kernels()
    g = globals()
    g["_lookup_jit"], g["_subset_table_jit"] = kern["lookup"], kern["subset_table"]
    jit = numba.njit(cache=True, nogil=True)
    gf2k.bind_jit(g, ("_transpose64",))
    return {"gram": jit(_gram_bits), "sums": jit(_weighted_sums), "fold": jit(_fold_bits),
            "transpose": g["_transpose64_jit"]}


def _pad64(x: np.ndarray) -> np.ndarray:
    out = np.zeros(64, dtype=np.uint64)
    out[:x.size] = x
    return out


def gram_bits(c: BitClaim, sig: np.ndarray, k: int, nw: int) -> np.ndarray:
    """The prover's symmetric Gram sums of one batch in k chunks of nw words (pairs in
    :func:`mpc3.gf2k._pairs` order), sig the weights of a chunk's 64 nw positions."""
    out = np.zeros(k * (k + 1) // 2, dtype=np.uint64)
    _kernels()["gram"](c.u, c.v, sig, k, nw, 0, nw, out, np.empty((8, 256), np.uint64))
    return out


def weighted_sums(z: np.ndarray, sig: np.ndarray, k: int, nw: int) -> np.ndarray:
    """sum_t sig[t] z_(i,t) for each of the k chunks of nw words of the packed bits z."""
    out = np.zeros(k, dtype=np.uint64)
    _kernels()["sums"](np.ascontiguousarray(z), sig, k, nw, out, np.empty((8, 256), np.uint64))
    return out


def fold_bits(X: np.ndarray | None, m: int, coefs: np.ndarray, k: int, nw: int) -> np.ndarray:
    """The first fold of one side (m, W) in k chunks of nw words at the Lagrange
    coefficients ``coefs`` (k,): (m 64 nw,) field elements, row-major; zeros for a side
    this party does not hold."""
    out = np.zeros((m, 64 * nw), dtype=np.uint64)
    if X is not None:
        tab = np.empty((8, 256), dtype=np.uint64)
        gf2k._kernels()["subset_table"](_pad64(coefs), tab)
        _kernels()["fold"](X, k, nw, tab, out)
    return out.reshape(-1)


@functools.cache
def _pair_coefs(k: int) -> np.ndarray:
    """L_i(e) L_i'(e) at the nodes e = k .. 2k - 2, by pair i <= i': (k - 1, pairs)."""
    lag = gf2k.node_lagrange(k, 2 * k - 1)[k:]
    pairs = gf2k._pairs(k)
    return gf2k.mul(lag[:, [i for i, _ in pairs]], lag[:, [i2 for _, i2 in pairs]])


def _evals(T: np.ndarray, k: int) -> np.ndarray:
    """h at the 2k - 1 nodes from its symmetric Gram sums T (h(w_i) = G[i, i] for i < k)."""
    diag = [p for p, (i, i2) in enumerate(gf2k._pairs(k)) if i == i2]
    C = _pair_coefs(k)
    return np.concatenate([T[diag], np.array([gf2k.dot(C[e], T) for e in range(k - 1)],
                                             dtype=np.uint64)])


def _challenge(seed: bytes) -> int:
    """A uniform field element that is not a node."""
    return next((int(w) for w in _words(seed, "bits/point", 4) if int(w) >= AVOID), AVOID)


# ------------------------------------------------------------------ the proof ----------
def verify_bits(p: Party, mine, as_left, as_right) -> tuple[bool, bool]:
    """Prove ``mine`` (a list of :class:`BitClaim`, one per batch) to the two neighbours and
    verify theirs (``as_left``: this party's views of next's batches, as its V_L;
    ``as_right``: of prev's, as its V_R); the three lists have one length and widths (the
    parties run in lockstep). Returns this party's verdicts (next's proof, prev's proof)
    for :func:`mpc3.dzkp.verify_claims` to send. Cost: :func:`cost_verify_bits`."""
    data = {"P": list(mine), "L": list(as_left), "R": list(as_right)}
    if not len(data["P"]) == len(data["L"]) == len(data["R"]):
        raise ValueError("the three roles' bit claims must come in the same batches")
    trios = list(zip(data["P"], data["L"], data["R"]))
    sizes = [max(c.words for c in trio) for trio in trios]
    live = [b for b, size in enumerate(sizes) if size]
    if not live:
        return True, True
    op = p.new_op()
    seed_of = {"L": lambda s: p.prg.bytes("prev", op, f"dzkpb/seed{s}", 16).tobytes(),
               "R": lambda s: p.prg.bytes("next", op, f"dzkpb/seed{s}", 16).tobytes()}

    def send_h(h: np.ndarray, step) -> dict:
        """The prover's h XOR-shared: V_L's share from their key, V_R's sent."""
        left = p.prg.ring("prev", op, f"dzkpb/h{step}", h.shape)
        _, got = p.comm.exchange(to_next=[h ^ left], from_prev=True)
        return {"P": h, "L": p.prg.ring("next", op, f"dzkpb/h{step}", h.shape),
                "R": one_array(got, p.comm.peer(-1), p.rank, np.uint64, h.size,
                               "share of h").reshape(h.shape)}

    nws = [-(-sizes[b] // K_FIRST) for b in live]
    at = np.cumsum([0] + [64 * nw for nw in nws])
    widths = [trios[b][0].width for b in live]
    sd = challenge_seeds(p, seed_of, 0)
    theta, sigmas = {}, {}
    for role, seed in sd.items():
        w = _words(seed, "bits/weights", K_FIRST + int(at[-1]))
        theta[role] = w[:K_FIRST]
        sigmas[role] = [w[K_FIRST + at[j]:K_FIRST + at[j + 1]] for j in range(len(live))]
    claims, checks = {}, {"L": [], "R": []}
    for role in ("L", "R"):
        sums = np.zeros(K_FIRST, dtype=np.uint64)
        for j, b in enumerate(live):
            sums ^= weighted_sums(data[role][b].z, sigmas[role][j], K_FIRST, nws[j])
        claims[role] = gf2k.dot(theta[role], sums)
    T = np.zeros(K_FIRST * (K_FIRST + 1) // 2, dtype=np.uint64)
    for j, b in enumerate(live):
        T ^= gram_bits(data["P"][b], sigmas["P"][j], K_FIRST, nws[j])
    hs = send_h(_evals(T, K_FIRST), 1)
    for role in ("L", "R"):
        checks[role].append(gf2k.dot(theta[role], hs[role][:K_FIRST]) ^ claims[role])
    vecs, k, step = {}, K_FIRST, 1
    while True:
        sd = challenge_seeds(p, seed_of, step)
        for role in data:
            r = _challenge(sd[role])
            lag = gf2k.lagrange(list(range(k)), r)
            if step == 1:
                U, V = [], []
                for j, b in enumerate(live):
                    c = data[role][b]
                    u = fold_bits(c.u, widths[j], lag, k, nws[j])
                    if c.u is not None:
                        u = gf2k.mul(u, np.tile(sigmas[role][j], widths[j]))
                    U.append(u)
                    V.append(fold_bits(c.v, widths[j], lag, k, nws[j]))
                vecs[role] = (np.concatenate(U), np.concatenate(V))
            else:
                vecs[role] = tuple(gf2k.fold(X, lag, k) for X in vecs[role])
            claims[role] = gf2k.at(hs[role], r)
        k = K
        U, V = vecs["P"]
        if U.size <= k:
            break
        step += 1
        hs = send_h(_evals(gf2k.gram(U, V, k), k), step)
        for role in ("L", "R"):
            checks[role].append(claims[role] ^ int(np.bitwise_xor.reduce(hs[role][:k])))
    # last: pad with one random value each, open at a final point
    kk = U.size
    pads = p.prg.ring("private", op, "dzkpb/pads", 2)

    def extended(vals: np.ndarray) -> np.ndarray:
        """values at nodes 0 .. kk, extended to nodes 0 .. 2 kk."""
        return np.concatenate([vals, np.array([gf2k.at(vals, e) for e in range(kk + 1, 2 * kk + 1)],
                                              dtype=np.uint64)])
    h = gf2k.mul(extended(np.append(U, pads[0])), extended(np.append(V, pads[1])))
    sent = send_h(np.concatenate([h, pads]), "last")
    opened = {}
    for role in ("L", "R"):
        hl, pad = sent[role][:2 * kk + 1], sent[role][2 * kk + 1:]
        x = claims[role] ^ int(np.bitwise_xor.reduce(hl[:kk]))
        r = _challenge(seed_of[role]("final"))
        Ul, Vl = vecs[role]
        opened[role] = np.array(checks[role] + [x, gf2k.at(np.append(Ul, pad[0]), r),
                                                gf2k.at(np.append(Vl, pad[1]), r), gf2k.at(hl, r)],
                                dtype=np.uint64)
    # V_L and V_R open to each other: as V_L (of next) talk to prev, as V_R to next
    from_next, from_prev = p.comm.exchange(to_prev=[opened["L"]], to_next=[opened["R"]],
                                           from_next=True, from_prev=True)
    return _accept(opened["L"], from_prev), _accept(opened["R"], from_next)


def _accept(mine: np.ndarray, got) -> bool:
    """Both verifiers' shares (the other's: ``got[0]``): every check 0, h(r) = p(r) q(r)."""
    theirs = got[0] if got else None
    if theirs is None or theirs.shape != mine.shape or theirs.dtype != np.uint64:
        return False
    tot = mine ^ theirs
    return bool(not tot[:-3].any()
                and gf2k.mul_int(int(tot[-3]), int(tot[-2])) == int(tot[-1]))
