"""Distributed zero-knowledge proofs that a batch of a party's messages was computed honestly.

The statement. Party P_i (the *prover*) sent messages whose correctness reduces to a batch of
gates ``sum_a u[a, j] * v[a, j] == z[j]`` over Z_2^64 (j < L, a < m). P_i knows every value;
its two neighbours, the *verifiers* V_L = P_{i-1} and V_R = P_{i+1}, hold additive shares of
u, v and z (a value one of them knows whole is shared as (value, 0)). For the replicated
product (:func:`mpc3.claims.mul_claims`) u and v are the cross terms of the two slots the verifiers hold
and z is the message minus what the receiver can account for.

The proof (Boyle-Gilboa-Ishai-Nof, CCS 2019: a fully linear PCP compiled to two verifiers
holding shares; lifted to the Galois ring of :mod:`mpc3.galois` for Z_2^64):

1. The verifiers send a challenge seed; every gate gets the weight theta_i sigma_t (j = (i, t);
   theta uniform ring elements, sigma uniform over the exceptional set of binary polynomials,
   whose coefficients are 0 or 1: the prover's products by sigma are masked additions), and
   the claim becomes one weighted sum. A false gate survives with probability <= 2 / 2^D:
   divided by the 2-power of its smallest error, the sum is a non-zero bilinear form in
   theta and sigma mod 2, both uniform over GF(2^D).
2. Compression by k: the prover sends (shared) the 2k - 1 values at public exceptional nodes
   of h(X) = sum_t p_t(X) q_t(X), p_t and q_t interpolating k chunks of u and v. The
   verifiers check sum_i theta_i h(w_i) == claim on shares (opened at the end) and send a
   random exceptional point r; the new claim is h(r) over vectors p_t(r), q_t(r), k times
   shorter. A false h passes with probability <= (2k - 2) / (2^D - 2k).
3. At length <= k the prover pads p and q with one random value each (their evaluation at r is
   then uniform: zero knowledge), sends h, and the verifiers open p(r), q(r), h(r) and every
   check between themselves only.

Rounds: 2 per compression after the first challenge, plus one exchange and one verdict.
Soundness per proof: see :func:`soundness_bits`; ``reps`` independent repetitions share the
rounds. The prover never learns a challenge before it has sent the message the challenge
tests: seeds come from the key the two verifiers share and the prover lacks, and V_R sends
each one only after receiving the prover's message. The three parties prove their own
batches at the same time, so every round carries three proofs. The matrix products'
random vectors (:mod:`mpc3.freivalds`) are drawn once for the three, from the XOR of the
three first seeds: every party holds all three after the first round (its own, received,
and the two it gives as a verifier), and for a cheating prover the XOR is uniform - its own
seed is, drawn from its verifiers' key and received only after its messages, and the other
two are fixed by keys it shares with an honest party, who checks what it sends
(:class:`SeedMismatch`). Each party then reduces each slot it holds once, not once a role.
The weight gamma that joins the products' claims to the first compression's is common too
(the XOR of the next round's seeds), and the products are reduced only then, with each
rho multiplied by gamma: U and the claims come out weighted (they are linear in rho), at
M ring products a matrix rather than one a term of U, straight into the folded vectors.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from .comm import CheatingDetected, SeedMismatch, one_array  # noqa: F401 - re-exported
from .dzkp_rounds import LINEAR_FAILED, send_verdicts, challenge_seeds
from .freivalds import reduce_mats
from . import dzkp_kernels as dk
from . import dzkp_ring_kernels as rk
from .galois import GaloisRing, galois_ring, long_matmul
from .party import Party
from .prg import aes_ctr_bytes


@dataclass(frozen=True)
class Params:
    """degree: of the Galois ring; reps: parallel repetitions; k: compression factor;
    k_first: that of the first compression (its data are Z_2^64 values, so a wide first
    step is cheap and shortens every later, Galois-ring step); None: 64 for batches of at
    least :data:`WIDE_TERMS` terms (its folded vectors, held until the next challenge, are
    half those of 32), else 32 (its first h is 64 ring elements, ~33 KB, smaller)."""

    degree: int = 32
    reps: int = 2
    k: int = 8
    k_first: int | None = None


#: Gate terms from which the first compression is by 64 rather than 32 (:class:`Params`).
WIDE_TERMS = 1 << 22
#: bytes of the digest of mod-2 linear relations (:func:`verify_claims`, ``linear``)
LINEAR_BYTES = 32


def _resolved(params: Params, terms: int) -> Params:
    """``params`` with k_first chosen for a batch of ``terms`` gate terms."""
    if params.k_first is not None:
        return params
    return replace(params, k_first=64 if terms >= WIDE_TERMS else 32)


@dataclass
class Claim:
    """One party's view of one prover's batch: u, v (m, L) and z (L,) over Z_2^64, whole for
    the prover, additive shares for each verifier. A verifier's side it holds nothing of is
    None (zero: V_L's v, V_R's u), never allocated."""

    u: np.ndarray | None
    v: np.ndarray | None
    z: np.ndarray
    #: where u (v) is held as bits: uint8 0/1 and each row's value (m,) - :func:`compact`
    us: np.ndarray | None = None
    vs: np.ndarray | None = None

    def __post_init__(self) -> None:
        given = [x for x in (self.u, self.v) if x is not None]
        if not given or any(x.ndim != 2 or x.shape != given[0].shape for x in given) \
                or self.z.shape != given[0].shape[1:]:
            raise ValueError(f"claim shapes u {getattr(self.u, 'shape', None)}, v "
                             f"{getattr(self.v, 'shape', None)}, "
                             f"z {self.z.shape}")

    @property
    def terms(self) -> int:
        """m L: the gate terms of the batch."""
        return (self.u if self.u is not None else self.v).size

    @property
    def width(self) -> int:
        """m: the terms of each gate."""
        return (self.u if self.u is not None else self.v).shape[0]


def compact(c: Claim) -> Claim:
    """The same claim, each side whose rows each hold zeros and one value (a boolean
    circuit's bits, lifted or scaled) held as uint8 bits and the rows' values: 8 times
    smaller, read by the proof as it is (:func:`mpc3.dzkp_kernels.rows`)."""
    sides = []
    for x, scale in ((c.u, c.us), (c.v, c.vs)):
        if x is not None and scale is None:
            held = dk.bit_rows(x)                # a side of words fails in its first row
            if held is not None:
                x, scale = held
        sides.append((x, scale))
    return Claim(sides[0][0], sides[1][0], c.z, sides[0][1], sides[1][1])


# ------------------------------------------------------------------ public costs ------
def _batches(L, m) -> list[tuple[int, int]]:
    """(gates, terms) of each non-empty batch: ``L`` and ``m`` ints, or sequences of them
    (batches of different numbers of terms, :func:`verify_claims`)."""
    if np.ndim(L) == 0:
        L, m = [L], [m]
    return [(int(a), int(b)) for a, b in zip(L, m) if a]


def _lengths(L, m, params: Params, ring_len: int = 0) -> list[int]:
    """Vector lengths entering each compression: the weighted Z_2^64 one (if any gates),
    then the Galois-ring ones (with the ``ring_len`` terms of matrix-product claims joined)."""
    k, batches = params.k, _batches(L, m)
    params = _resolved(params, sum(a * b for a, b in batches))
    out = [sum(a for a, _ in batches)] if batches else []
    n = sum(b * -(-a // params.k_first) for a, b in batches) + ring_len
    while n > k:
        out.append(n)
        n = -(-n // k)
    out.append(n)
    return out


def soundness_bits(L, m, params: Params = Params(), ring_len: int = 0) -> float:
    """-log2 of the probability that a false batch passes: per repetition 2 / 2^D for the
    gate weights, 2 / 2^D for the matrix products' random vectors and 1 / 2^D for joining
    them, (2k - 2) / (2^D - 2K - 1) per compression (k_first for the first) and
    2k' / (2^D - 2K - 1) for the last, K the larger factor; repetitions are independent."""
    params = _resolved(params, sum(a * b for a, b in _batches(L, m)))
    g, k, k1 = 2.0 ** params.degree, params.k, params.k_first
    steps = _lengths(L, m, params, ring_len)
    last, free = steps[-1], g - _avoid(params)
    gates = bool(_batches(L, m))
    first = 2 * k1 - 2 if gates else 2 * k - 2
    eps = (2 * gates + 3 * (ring_len > 0)) / g \
        + (first + (len(steps) - 2) * (2 * k - 2) + 2 * last) / free
    return -params.reps * math.log2(min(eps, 1.0))


def cost_verify(L, m, params: Params = Params(),
                ring_len: int = 0, linear: bool = False,
                verdicts: bool = False) -> tuple[int, int]:
    """(rounds, bytes each party sends) of :func:`verify_claims` for batches of L gates of m
    terms (or sequences: one batch per entry) and matrix-product claims of ``ring_len``
    inner terms (every party proves one batch of that size); ``linear``: with the 32-byte
    digest of mod-2 linear relations (a round of its own when there is nothing to prove);
    ``verdicts``: with nothing to prove, the verdicts are still sent (a round; digests,
    linear relations or mod-2 gates to report on)."""
    gates = bool(_batches(L, m))
    if not gates and ring_len == 0:
        return (int(linear) + int(verdicts), LINEAR_BYTES * linear + 2 * 4 * verdicts)
    params = _resolved(params, sum(a * b for a, b in _batches(L, m)))
    steps = _lengths(L, m, params, ring_len)
    elt = params.reps * params.degree * 8
    S = len(steps)
    first = 2 * (params.k_first if gates else params.k) - 1
    bytes_ = 32 * S                     # challenge seeds (V_L and V_R -> prover)
    bytes_ += (first + (S - 2) * (2 * params.k - 1)) * elt * (S > 1)    # each h
    bytes_ += (2 * steps[-1] + 1 + 2) * elt             # last h and the two pads
    bytes_ += 2 * (S + 3) * elt                         # checks, p(r), q(r), h(r) both ways
    bytes_ += 2 * 4                                     # verdicts
    return 2 * S + 2, bytes_ + (LINEAR_BYTES if linear else 0)


# --------------------------------------------------------------- randomness ------------
def _words(seed: bytes, tag: str, n: int) -> np.ndarray:
    nonce = (tag.encode() + bytes(16))[:16]
    return np.frombuffer(aes_ctr_bytes(seed, nonce, 8 * n), dtype=np.uint64).copy()


def _bits(seed: bytes, tag: str, n: int) -> np.ndarray:
    """n uniform 0/1 words, one keystream bit each."""
    nonce = (tag.encode() + bytes(16))[:16]
    raw = np.frombuffer(aes_ctr_bytes(seed, nonce, -(-n // 8)), dtype=np.uint8)
    return np.unpackbits(raw, count=n, bitorder="little").astype(np.uint64)


def _challenge(g: GaloisRing, seed: bytes, reps: int, avoid: int) -> np.ndarray:
    """reps exceptional points, none equal mod 2 to the nodes 0 .. avoid - 1."""
    raw = _words(seed, "point", 4 * reps).reshape(reps, 4) & np.uint64((1 << g.D) - 1)
    pick = [next((int(w) for w in row if int(w) >= avoid), avoid) for row in raw]
    return g.from_ints(np.array(pick))


# ------------------------------------------------------------------ the proof ----------
def _avoid(params: Params) -> int:
    """Challenges are exceptional points above every node (integers 0 .. 2K)."""
    return 2 * max(params.k, params.k_first) + 1


@functools.cache
def _round(degree: int, k: int) -> "_Round":
    return _Round(galois_ring(degree), k)


class _Round:
    """What the three roles of one party need across the compressions."""

    def __init__(self, g: GaloisRing, k: int) -> None:
        self.g, self.k = g, k
        self.nodes = g.from_ints(np.arange(2 * k + 1))
        # L_i(w_e) for the k data nodes at all 2k - 1 nodes, and its pairwise products
        lag = g.lagrange(self.nodes[:k], self.nodes[:2 * k - 1])
        pair = g.mul(lag[k:, :, None, :], lag[k:, None, :, :])        # (k-1, k, k, D)
        # the nodes after the k data nodes, by pair i <= i' (L_i L_i' is symmetric)
        self.pairs = dk.pairs(k)
        self._pairs_sym = np.ascontiguousarray(
            np.stack([pair[:, i, i2] for i, i2 in self.pairs]))             # (P, k-1, D)
        self._diag = np.array([p for p, (i, i2) in enumerate(self.pairs) if i == i2])

    def evals(self, sym: np.ndarray) -> np.ndarray:
        """h at the 2k - 1 nodes from T[(i, i')] = G[i, i'] + G[i', i] (G[i, i] on the
        diagonal), G[i, i'] = sum_t u_it v_i't: (reps, 2k-1, D) - h(w_i) = G_ii for i < k,
        and at the other nodes sum over i <= i' of L_i(w) L_i'(w) T[i, i'], one GEMM per
        repetition."""
        return np.stack([np.concatenate([T[self._diag], self.g.combine(self._pairs_sym, T)])
                         for T in sym])

    def at(self, values: np.ndarray, r: np.ndarray, nodes: int) -> np.ndarray:
        """Each repetition's polynomial through ``values`` (reps, nodes, D) at the nodes
        0 .. nodes - 1, evaluated at its r (reps, D)."""
        lag = self.g.lagrange(self.nodes[:nodes], r)                    # (reps, nodes, D)
        return self.g.mul(lag, values).sum(axis=1)


def _chunks(x: np.ndarray, k: int, n: int | None = None) -> np.ndarray:
    """(..., L[, D]) -> (..., k, n[, D]) zero-padded, chunk i = elements i*n .. (i+1)*n - 1
    (n: ceil(L / k) unless given, >= that)."""
    axis = 1 if x.ndim >= 2 else 0
    L = x.shape[axis]
    n = -(-L // k) if n is None else n
    if k * n != L:
        shape = list(x.shape)
        shape[axis] = k * n
        padded = np.zeros(shape, dtype=x.dtype)
        padded[(slice(None),) * axis + (slice(0, L),)] = x
        x = padded
    return x.reshape(x.shape[:axis] + (k, n) + x.shape[axis + 1:])


def _gram(g: GaloisRing, rd: _Round, U: np.ndarray, V: np.ndarray) -> np.ndarray:
    """T[j, (i, i')] = G[i, i'] + G[i', i] (G[i, i] on the diagonal) for ring vectors U, V
    (reps, N, D) in k chunks, G[i, i'] = sum_t U_it V_i't: from P = sum_t (U_i + U_i')
    (V_i + V_i') as P[i, i'] - G[i, i] - G[i', i']. (reps, pairs, D)."""
    P = g.fold_products(rk.gram_ring(U, V, rd.k))                 # (reps, pairs, D)
    diag = P[:, rd._diag]
    for p, (i, i2) in enumerate(rd.pairs):
        if i != i2:
            P[:, p] -= diag[:, i] + diag[:, i2]
    return P


def verify_claims(p: Party, mine, as_left, as_right,
                  params: Params = Params(), digests: tuple | None = None,
                  mats: tuple | None = None, linear: tuple | None = None,
                  bits: tuple | None = None, scratch=None) -> None:
    """Prove ``mine`` to the two neighbours and verify theirs; raise
    :class:`CheatingDetected` at every party if any proof fails. ``as_left``: this party's
    shares of the next party's claim (this party is its V_L); ``as_right``: of the previous
    party's claim (V_R). Each is a :class:`Claim` or a list of them (batches of gates with
    different numbers of terms: chunked apart, one gate weight theta_i sigma_t over all of
    them); the three must have one shape (the parties run in lockstep). ``digests``: this
    party's verdicts on the openings and on the inputs' replicas (:mod:`mpc3.checks`), sent
    with the proofs' verdicts. ``mats``: lists of matrix-product claims
    (:class:`mpc3.freivalds.MatClaim`) in the same three roles, reduced by random ring
    vectors and joined to the batch. ``linear``: this party's digests of its shares of
    mod-2 linear relations (as V_L of next, as V_R of prev; :meth:`mpc3.checks.Checks.linear`):
    V_R's goes to V_L with the openings; a mismatch fails the prover's proof. ``bits``: this
    party's verdicts on next's and prev's proofs of mod-2 gates
    (:func:`mpc3.dzkp_bits.verify_bits`), sent with these. ``scratch``: a
    :class:`mpc3.scratch.Scratch` the first fold's vectors are written into (kept from one
    flush to the next), else fresh arrays. Cost: :func:`cost_verify`."""
    with dk.verifying():
        _verify(p, mine, as_left, as_right, params, digests, mats, linear, bits, scratch)


def _linear_ok(linear: tuple | None, extra: list) -> bool:
    """Whether prev's digest (as V_R of next; ``extra``: the arrays it sent past the
    openings) is this party's own (as V_L); true without linear relations."""
    return linear is None or (len(extra) == 1 and extra[0].tobytes() == linear[0])


def _verify(p: Party, mine, as_left, as_right, params: Params, digests: tuple | None,
            mats: tuple | None, linear: tuple | None, bits: tuple | None,
            scratch) -> None:
    data = {role: cs if isinstance(cs, list) else list(cs) if isinstance(cs, tuple) else [cs]
            for role, cs in (("P", mine), ("L", as_left), ("R", as_right))}
    if not len(data["P"]) == len(data["L"]) == len(data["R"]):
        raise ValueError("the three roles' claims must come in the same batches")
    # batch b of every role is one record's gates, as long as the longest of the three
    # provers' (the same at every party); shorter views are zero past their end
    sizes = [max(c.z.size for c in trio) for trio in zip(data["P"], data["L"], data["R"])]
    live = [b for b, size in enumerate(sizes) if size]
    lin_out = [] if linear is None else [np.frombuffer(linear[1], np.uint8)]
    ring_len = sum(c.inner for c in mats[0]) if mats else 0
    if not live and ring_len == 0:
        ok = linear is None or _linear_ok(
            linear, p.comm.exchange(to_next=lin_out, from_prev=True)[1])
        if digests is not None or linear is not None or bits is not None:
            bits = bits or (True, True)
            send_verdicts(p, np.array([(1 if ok else LINEAR_FAILED) if bits[0] else 0, bits[1],
                                   *(digests or (1, 1))], dtype=np.uint8))
        return
    params = _resolved(params, sum(sizes[b] * data["P"][b].width for b in live))
    g, k, k1, reps = galois_ring(params.degree), params.k, params.k_first, params.reps
    rd, rd1, avoid = _round(params.degree, k), _round(params.degree, k1), _avoid(params)
    op = p.new_op()
    seed_of = {"L": lambda s: p.prg.bytes("prev", op, f"dzkp/seed{s}", 16).tobytes(),
               "R": lambda s: p.prg.bytes("next", op, f"dzkp/seed{s}", 16).tobytes()}

    def share_from_prover(stream: str, s: int, shape) -> np.ndarray:
        return p.prg.ring(stream, op, f"dzkp/h{s}", shape)

    # round 0: both verifiers hand each prover the seed of the gate weights and vectors
    seeds = challenge_seeds(p, seed_of, 0)
    mat_words = None        # the matrix products' vectors: one set for the three proofs
    if ring_len:
        common = _common(seeds)
        mat_words = lambda n: _words(common, "mats", n)     # noqa: E731
    claims, vecs, checks, hs = {}, {}, {"L": [], "R": []}, {}
    awaiting, step = None, 0
    if live:
        ns = [-(-sizes[b] // k1) for b in live]
        at = np.cumsum([0] + ns)
        n = int(at[-1])
        weights = {}
        for role, seed in seeds.items():      # theta: ring elements; sigma: binary
            sig = _bits(seed, "sigma", reps * n * g.D).reshape(reps, n, g.D)
            weights[role] = (_words(seed, "weights", reps * k1 * g.D).reshape(reps, k1, g.D),
                             [sig[:, at[b]:at[b + 1]] for b in range(len(ns))])
        # first compression: Z_2^64 data, weighted gates
        for role in ("L", "R"):
            theta, sigmas = weights[role]
            s = sum(long_matmul(_chunks(data[role][b].z, k1, n), np.ascontiguousarray(
                sigma.transpose(1, 0, 2).reshape(-1, reps * g.D)))
                for b, n, sigma in zip(live, ns, sigmas)).reshape(k1, reps, g.D)
            claims[role] = g.mul(theta, s.transpose(1, 0, 2)).sum(axis=1)   # (reps, D)
        # G = sum_t sigma_t u_it v_i't, by symmetric pairs (mpc3.dzkp_kernels), per batch
        sym = sum(dk.gram_int(c.u, c.v, np.ascontiguousarray(
            sigma.transpose(1, 0, 2).reshape(-1, reps * g.D)), k1, c.us, c.vs)
            for c, sigma in zip((data["P"][b] for b in live), weights["P"][1])
        ).reshape(-1, reps, g.D)
        h = rd1.evals(np.ascontiguousarray(sym.transpose(1, 0, 2)))
        hs["P"], hs["L"], hs["R"] = _send_h(p, h, share_from_prover, 1)
        for role in ("L", "R"):
            checks[role].append(g.mul(weights[role][0], hs[role][:, :k1]).sum(axis=1)
                                - claims[role])
        awaiting, step = "first", 1
    else:                   # the products' claims start the proof
        for role, (U, V, c) in zip(data, reduce_mats(g, mats, reps, mat_words)):
            vecs[role], claims[role] = (U, V), c
        mat_words = None
    while True:
        if awaiting:
            seeds = challenge_seeds(p, seed_of, step)
            for role in data:
                r = _challenge(g, seeds[role], reps, avoid)
                if awaiting == "first":
                    vecs[role] = _fold_first(g, rd1, data[role], live, ns, weights[role][1],
                                             r, k1, ring_len if mat_words else 0,
                                             _taker(scratch, role))
                    claims[role] = rd1.at(hs[role], r, 2 * k1 - 1)
                else:
                    vecs[role] = _fold(g, rd, vecs[role], r, k)
                    claims[role] = rd.at(hs[role], r, 2 * k - 1)
            if mat_words is not None:
                # join the products' claims, weighted by gamma: their vectors are reduced
                # straight into the tails the first fold left for them
                gamma = g.exceptional(_words(_common(seeds), "join", reps))
                tails = [tuple(x[:, x.shape[1] - ring_len:] for x in vecs[role])
                         for role in data]
                for role, (_, _, c) in zip(data, reduce_mats(g, mats, reps, mat_words, gamma,
                                                             tails)):
                    claims[role] = claims[role] + c
            mat_words = None
        U, V = vecs["P"]
        if U.shape[1] <= k:
            break
        step += 1
        h = rd.evals(_gram(g, rd, U, V))
        hs["P"], hs["L"], hs["R"] = _send_h(p, h, share_from_prover, step)
        for role in ("L", "R"):
            checks[role].append(hs[role][:, :k].sum(axis=1) - claims[role])
        awaiting = "ring"
    # last compression: pad with one random value each, open at a final point
    kk = U.shape[1]
    pads = p.prg.ring("private", op, "dzkp/pads", (reps, 2, g.D))
    def extended(vals: np.ndarray) -> np.ndarray:
        """(reps, kk+1, D) values at nodes 0 .. kk, extended to nodes 0 .. 2kk."""
        ext = [rd.at(vals, np.broadcast_to(rd.nodes[e], (reps, g.D)), kk + 1)
               for e in range(kk + 1, 2 * kk + 1)]
        return np.concatenate([vals] + [e[:, None] for e in ext], axis=1)
    h = g.mul(extended(np.concatenate([U, pads[:, :1]], axis=1)),
              extended(np.concatenate([V, pads[:, 1:]], axis=1)))     # (reps, 2kk+1, D)
    packed = np.concatenate([h, pads.reshape(reps, 2, g.D)], axis=1)
    sent = {}
    sent["P"], sent["L"], sent["R"] = _send_h(p, packed, share_from_prover, "last")
    opened = {}
    for role in ("L", "R"):
        hl, pad = sent[role][:, :2 * kk + 1], sent[role][:, 2 * kk + 1:]
        checks[role].append(hl[:, :kk].sum(axis=1) - claims[role])
        Ul, Vl = vecs[role]
        r = _challenge(g, seed_of[role]("final"), reps, avoid)
        pr = rd.at(np.concatenate([Ul, pad[:, :1]], axis=1), r, kk + 1)
        qr = rd.at(np.concatenate([Vl, pad[:, 1:]], axis=1), r, kk + 1)
        hr = rd.at(hl, r, 2 * kk + 1)
        opened[role] = np.concatenate([np.stack(checks[role], axis=1), pr[:, None], qr[:, None],
                                       hr[:, None]], axis=1)
    # V_L and V_R open to each other: as V_L (of next) talk to prev, as V_R to next
    from_next, from_prev = p.comm.exchange(to_prev=[opened["L"]], to_next=[opened["R"], *lin_out],
                                           from_next=True, from_prev=True)
    bits = bits or (True, True)
    ok = _accept(g, opened["L"], from_prev) and bits[0]
    send_verdicts(p, np.array([LINEAR_FAILED if ok and not _linear_ok(linear, from_prev[1:]) else ok,
                           _accept(g, opened["R"], from_next) and bits[1],
                           *((1, 1) if digests is None else digests)], dtype=np.uint8))


def _common(seeds: dict) -> bytes:
    """The XOR of the three proofs' seeds of one round (module docstring)."""
    return bytes(a ^ b ^ c for a, b, c in zip(seeds["P"], seeds["L"], seeds["R"]))


def _send_h(p: Party, h: np.ndarray, share_from_prover, step) -> tuple:
    """The prover's ring values h, split: V_L's share drawn from their common key, V_R's
    sent. Returns (whole, this party's share as V_L of next, as V_R of prev)."""
    left = share_from_prover("prev", step, h.shape)
    _, got = p.comm.exchange(to_next=[h - left], from_prev=True)
    as_left = share_from_prover("next", step, h.shape)
    return h, as_left, one_array(got, p.comm.peer(-1), p.rank, np.uint64, h.size,
                                 "share of h").reshape(h.shape)


def _fold_first(g: GaloisRing, rd: _Round, batches: list, live: list, ns: list, sigmas: list,
                r: np.ndarray, k: int, extra: int = 0, take=None):
    """u'_(a,t) = sigma_t p_(a,t)(r), v'_(a,t) = q_(a,t)(r) of every live batch for Z_2^64
    data: :func:`mpc3.dzkp_kernels.fold_batches` (which releases each batch)."""
    return dk.fold_batches(batches, live, ns, sigmas, g.lagrange(rd.nodes[:k], r), g._taps,
                           k, extra, take)


def _taker(scratch, role: str):
    """Where a role's first-fold vectors live: ``scratch``'s buffers by role and side."""
    if scratch is None:
        return None
    return lambda side, shape, zero: scratch.take(f"dzkp/first/{role}/{side}", shape, zero)


def _fold(g: GaloisRing, rd: _Round, vecs, r: np.ndarray, k: int):
    mats = g.mul_matrix(g.lagrange(rd.nodes[:k], r))                  # (reps, k, D, D)
    return tuple(rk.fold_ring(X, k, mats) for X in vecs)


def _accept(g: GaloisRing, mine: np.ndarray, got: list) -> bool:
    """Both verifiers' shares (the other's: ``got[0]``): checks 0, h(r) == p(r) q(r)."""
    theirs = got[0] if got else None
    if theirs is None or theirs.shape != mine.shape:
        return False
    tot = mine + theirs
    checks, pr, qr, hr = tot[:, :-3], tot[:, -3], tot[:, -2], tot[:, -1]
    return bool(not checks.any() and np.array_equal(g.mul(pr, qr), hr))
