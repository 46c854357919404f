"""Claims of replicated matrix products, reduced by random ring vectors (Freivalds) to inner
products as long as the inner dimension - not as many gates as the product has outputs.

A party's term of ``x @ y`` (:func:`mpc3.kernels.arith._local_matmul`), in both of its
forms, is ``X_a Y_b + X_b Y_a`` over the whole inner dimension (the cross terms of its two
slots a = i, b = i + 1) plus ``X_a Y_a`` over some blocks of it and ``X_b Y_b`` over others
(the five-product form's roles; the two-product form has ``X_a Y_a`` everywhere). Its
verifiers each hold one slot: V_L = P_{i-1} holds slot i, V_R = P_{i+1} slot i + 1. With
ring vectors rho (rows) and kappa (columns) drawn after the message was sent,

    rho^T (message - masks - X_a Y_a - X_b Y_b) kappa
        = <rho^T X_a, Y_b kappa> + <rho^T X_b, Y_a kappa>,

where each verifier computes its share of the left side alone (the diagonal terms are one
verifier's: it holds both factors) and holds one factor of each inner product. A false
message survives the vectors with probability <= 2 / 2^D (a bilinear form over GF(2^D),
:mod:`mpc3.galois`); the inner products then join the batch :func:`mpc3.dzkp.verify_claims`
proves.

One set of vectors serves the three proofs of a flush (drawn from the XOR of their three
first challenge seeds: uniform for each prover and unknown to it until its messages are
sent, :mod:`mpc3.dzkp`). A party then reduces each slot it holds once: its slot a serves its
own proof and, held by it as V_R of prev, prev's; its slot b its own and next's. Cost of
the reduction, local: 2 (M + N) K ring multiply-adds per repetition and coefficient a party
(its two slots of x and of y), plus M N for each of its three targets.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import ring
from .galois import GaloisRing, long_matmul
from .kernels.arith import five_product_form, k_blocks
from .shares import AShare


@dataclass
class MatClaim:
    """One party's view of one prover's 2-D product: the prover's slots (None where this
    party holds nothing of it), its share of ``target`` = message - masks, and the inner
    positions where ``X_a Y_a`` / ``X_b Y_b`` belong to the prover's term."""

    xa: np.ndarray | None
    xb: np.ndarray | None
    ya: np.ndarray | None
    yb: np.ndarray | None
    target: np.ndarray
    aa: np.ndarray
    bb: np.ndarray

    @property
    def inner(self) -> int:
        """Terms this claim adds to the joined inner product: both cross terms' K."""
        return 2 * self.aa.shape[0]


def _diagonal_masks(x_shape, y_shape, rank: int) -> tuple[np.ndarray, np.ndarray]:
    K = x_shape[-1]
    aa, bb = np.zeros(K, bool), np.zeros(K, bool)
    if not five_product_form(x_shape, y_shape):
        aa[:] = True
        return aa, bb
    for j, kb in enumerate(k_blocks(K)):
        role = (rank - j) % 3
        aa[kb] = role == 0
        bb[kb] = role in (0, 1)
    return aa, bb


def mat_shaped(x_shape: tuple, y_shape: tuple) -> bool:
    """Whether :func:`mat_views` takes ``x @ y`` as it is: a matrix (or a stack of them, as
    rows) times one matrix, or equal batches of matrices (else :func:`as_matrices`)."""
    return (len(y_shape) == 2 and len(x_shape) >= 2) or (
        len(x_shape) == len(y_shape) >= 3 and x_shape[:-2] == y_shape[:-2])


def as_matrices(x: AShare, y: AShare) -> tuple[AShare, AShare]:
    """``x @ y``'s operands as :func:`mat_shaped` takes them: a vector made a one-row (x) or
    one-column (y) matrix, batches that broadcast against each other made equal (the
    operand whose batch differs copied). The product has the same entries in the same
    order: only numpy's shape of it differs."""
    if x.a.ndim == 1:
        x = AShare(x.a[None], x.b[None])
    if y.a.ndim == 1:
        y = AShare(y.a[:, None], y.b[:, None])
    if not mat_shaped(x.shape, y.shape):
        batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
        x, y = (t if t.shape[:-2] == batch else AShare(*(
            np.ascontiguousarray(np.broadcast_to(h, batch + t.shape[-2:])) for h in (t.a, t.b)))
            for t in (x, y))
    return x, y


def matmul_claims(p, x, y, out, kop: int, tag: str = "reshare"):
    """The three views (own, as V_L of next, as V_R of prev) of ``matmul_aa``'s plain
    reshare of ``x @ y`` (``out`` its result: ``out.a`` sent, ``out.b`` received); lists of
    one claim per batch item."""
    f_next, f_prev = (p.prg.ring(s, kop, tag, out.shape) for s in ("next", "prev"))
    return mat_views(p.rank, x, y, out.a, out.b, None, f_next, f_prev)


def mat_views(rank: int, x, y, term, left, right, f_next, f_prev):
    """:func:`matmul_claims` of each party's masked 3-out-of-3 term of ``x @ y`` held by its
    verifiers one part each (:func:`mpc3.claims.mul_views`; arrays of the output's shape,
    ``right`` None: nothing); operands of any shape np.matmul takes (:func:`as_matrices`)."""
    masks = [_diagonal_masks(x.shape, y.shape, prover)             # the same for every item
             for prover in (rank, (rank + 1) % 3, (rank - 1) % 3)]
    x, y = as_matrices(x, y)
    if y.a.ndim == 2:
        items = [(x.a.reshape(-1, x.shape[-1]), x.b.reshape(-1, x.shape[-1]), y.a, y.b)]
    else:                                                               # equal batches
        items = list(zip(*(t.reshape(-1, *t.shape[-2:]) for t in (x.a, x.b, y.a, y.b))))
    cols = y.shape[-1]
    flat = lambda t: None if t is None else t.reshape(-1, cols)      # noqa: E731
    term, left, right, f_next, f_prev = map(flat, (term, left, right, f_next, f_prev))
    rows = items[0][0].shape[0]
    views = ([], [], [])
    for i, (xa, xb, ya, yb) in enumerate(items):
        at = slice(i * rows, (i + 1) * rows)
        fn, fp = f_next[at], f_prev[at]
        for role, view in enumerate(views):
            aa, bb = masks[role]
            if role == 0:                   # the prover: everything, its own masks
                view.append(MatClaim(xa, xb, ya, yb, term[at] - fn + fp, aa, bb))
            elif role == 1:                 # V_L of next: its slot a is this party's b
                view.append(MatClaim(xb, None, yb, None, left[at] + fn, aa, bb))
            else:                           # V_R of prev: its slot b is this party's a
                view.append(MatClaim(None, xa, None, ya,
                                     -fp if right is None else right[at] - fp, aa, bb))
    return views


def reduce_mats(g: GaloisRing, views: tuple, reps: int, words, weight=None,
                outs: list | None = None) -> list[tuple]:
    """The three roles' claims (own, as V_L of next, as V_R of prev: lists of
    :class:`MatClaim`, item by item of one shape) reduced by one set of random vectors
    (``words(n)``: n uniform words, the same at the three parties): for each role (U, V)
    (reps, sum of inner, D) and the claimed inner product (reps, D), this party's shares.
    One set serves the three proofs, so a slot two roles read - the prover's a, which it
    also holds as V_R of prev, and its b, held as V_L of next - is reduced once.
    ``weight`` (reps, D): every rho multiplied by it first, which multiplies U and the
    claims by it (all are linear in rho) - the join's weight (:mod:`mpc3.dzkp`) at M
    products a row rather than the inner dimension's. ``outs``: each role's (U, V) to write
    into (every position is written), else allocated."""
    D = g.D
    sizes = [c.target.shape for c in views[0]]
    w = words(reps * D * sum(M + N for M, N in sizes))
    inner = sum(c.inner for c in views[0])
    outs = outs or [tuple(np.empty((reps, inner, D), dtype=np.uint64) for _ in range(2))
                    for _ in views]
    acc = np.zeros((len(views), 2, reps, D, D), dtype=np.uint64)   # coefficient products: +, -
    at = pos = 0
    for i, (M, N) in enumerate(sizes):
        rho = w[at:at + M * reps * D].reshape(M, reps * D)
        at += M * reps * D
        kap = w[at:at + N * reps * D].reshape(N, reps * D)
        at += N * reps * D
        if weight is not None:
            rho = g.mul(rho.reshape(M, reps, D), weight).reshape(M, reps * D)
        kappa = [np.ascontiguousarray(kap[:, j * D:(j + 1) * D]) for j in range(reps)]
        K = views[0][i].aa.shape[0]
        done = {}

        def reduced(X, left: bool):         # rho^T X or X kappa: (reps, K, D), once a slot
            key = (id(X), left)
            if key not in done:
                r = long_matmul(np.ascontiguousarray(X.T), rho) if left else \
                    long_matmul(X, kap)
                done[key] = r.reshape(K, reps, D).transpose(1, 0, 2)
            return done[key]
        first, second = slice(pos, pos + K), slice(pos + K, pos + 2 * K)
        for (U, V), view, sums in zip(outs, views, acc):
            c = view[i]
            la, lb, ra, rb = (None if X is None else reduced(X, left) for X, left in
                              ((c.xa, True), (c.xb, True), (c.ya, False), (c.yb, False)))
            for dst, part, val in ((U, first, la), (U, second, lb), (V, first, rb),
                                   (V, second, ra)):
                dst[:, part] = 0 if val is None else val
            tr = long_matmul(np.ascontiguousarray(c.target.T), rho).reshape(N, reps, D)
            for j in range(reps):                                   # rho^T T kappa
                ring.matmul(np.ascontiguousarray(tr[:, j].T), kappa[j], sums[0, j])
                for lx, ry, mask in ((la, ra, c.aa), (lb, rb, c.bb)):   # minus the diagonal
                    if lx is not None and ry is not None and mask.any():
                        ring.matmul(np.ascontiguousarray(lx[j, mask].T),
                                    np.ascontiguousarray(ry[j, mask]), sums[1, j])
        pos += 2 * K
    return [(U, V, g.fold_products(sums[0] - sums[1])) for (U, V), sums in zip(outs, acc)]
