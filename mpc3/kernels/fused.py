"""Compiled element loops of the pair side of truncation
(:func:`mpc3.kernels.truncation.trunc_steps`).

Each replaces a chain of numpy expressions (one pass and one temporary array per operator) by
one pass; shifts, offsets and masks are arrays of one element (every element alike) or of
one per element. Compiled lazily by numba (:func:`mpc3.ring.jit_pair`); tests compare them
with the numpy expressions they replace.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .. import ring
from ..ringmm import once


def _split_kernel(z: np.ndarray, other: np.ndarray, add_low: np.ndarray, sh: np.ndarray,
                  off_sh: np.ndarray, w_out: np.ndarray, bt_out: np.ndarray
                  ) -> None:  # pragma: no cover
    """B = z + other (other empty: B = z); Bp = B + add_low; W = (Bp >>a sh) - off_sh;
    bt = Bp >> 63."""
    n = z.size
    has_other = other.size == n
    for i in range(n):
        b = z[i] + other[i] if has_other else z[i]
        bp = b + add_low[i if add_low.size > 1 else 0]
        s = sh[i if sh.size > 1 else 0]
        w_out[i] = np.uint64(np.int64(bp) >> s) - off_sh[i if off_sh.size > 1 else 0]
        bt_out[i] = bp >> np.uint64(63)


def _round2_kernel(w: np.ndarray, bt: np.ndarray, r: np.ndarray, nu_own: np.ndarray,
                   nu_other: np.ndarray, low: np.ndarray, up: np.ndarray, m: np.ndarray,
                   x_out: np.ndarray, xs_out: np.ndarray) -> None:  # pragma: no cover
    """w -= ((nu_own + nu_other) m) << up (in place); x = (bt * r + nu_own) & low;
    xs = (x m) << up (m: the multiplier of a scaled truncation, else 1)."""
    for i in range(w.size):
        u = up[i if up.size > 1 else 0]
        mi = m[i if m.size > 1 else 0]
        w[i] -= ((nu_own[i] + nu_other[i]) * mi) << u
        x = (bt[i] * r[i] + nu_own[i]) & low[i if low.size > 1 else 0]
        x_out[i] = x
        xs_out[i] = (x * mi) << u


def _single_kernel(a: np.ndarray, b: np.ndarray, kappa: np.ndarray, rho: np.ndarray,
                   sh: np.ndarray, low: np.ndarray, uk_out: np.ndarray,
                   t_out: np.ndarray) -> None:  # pragma: no cover
    """A = a + b (b empty: A = a); Uk = (A >>a sh) - kappa; t = ((A >> 63) - rho) & low
    (t_out empty: not computed)."""
    n = a.size
    has_b = b.size == n
    exact = t_out.size == n
    for i in range(n):
        x = a[i] + b[i] if has_b else a[i]
        uk_out[i] = np.uint64(np.int64(x) >> sh[i if sh.size > 1 else 0]) - kappa[i]
        if exact:
            t_out[i] = ((x >> np.uint64(63)) - rho[i]) & low[i if low.size > 1 else 0]


def _final_kernel(uk: np.ndarray, kappa: np.ndarray, x1: np.ndarray, x2: np.ndarray,
                  up: np.ndarray, m: np.ndarray, a_out: np.ndarray,
                  b_out: np.ndarray) -> None:  # pragma: no cover
    """a = Uk + ((x2 m) << up); b = kappa + ((x1 m) << up)."""
    for i in range(uk.size):
        u = up[i if up.size > 1 else 0]
        mi = m[i if m.size > 1 else 0]
        a_out[i] = uk[i] + ((x2[i] * mi) << u)
        b_out[i] = kappa[i] + ((x1[i] * mi) << u)


def _mulshift(v: np.uint64, m: np.uint64, sh: np.int64, h: np.uint64) -> np.uint64:  # pragma: no cover
    """floor((signed(v) * m + h) / 2^sh) mod 2^64, exactly (a 95-bit product, never reduced
    before the shift), for m < 2^31, 0 <= h < 2^sh and 1 <= sh <= 62: signed(v) = hi 2^32 +
    lo with hi = v >>a 32, so v m + h = (hi m) 2^32 + (lo m + h) with both parts in 64 bits."""
    hi = np.int64(v) >> np.int64(32)
    q = (v & np.uint64(0xFFFFFFFF)) * m + h
    p = hi * np.int64(m)
    if sh >= 32:
        return np.uint64((p + np.int64(q >> np.uint64(32))) >> (sh - np.int64(32)))
    return (np.uint64(p) << np.uint64(32 - sh)) + (q >> np.uint64(sh))


_mulshift_jit = _mulshift  # replaced by its compiled form when the kernels are compiled


def _split_scaled_kernel(z: np.ndarray, other: np.ndarray, offset: np.uint64, m: np.ndarray,
                         sh: np.ndarray, low: np.ndarray, w_out: np.ndarray,
                         bt_out: np.ndarray) -> None:  # pragma: no cover
    """The pair's side of a scaled truncation: B = z + other (other empty: B = z);
    Bp = B + offset; W = floor((signed(Bp) m + low) / 2^sh) - (offset >> sh) m;
    bt = Bp >> 63."""
    n = z.size
    has_other = other.size == n
    for i in range(n):
        b = z[i] + other[i] if has_other else z[i]
        bp = b + offset
        s = sh[i if sh.size > 1 else 0]
        mi = m[i if m.size > 1 else 0]
        w_out[i] = _mulshift_jit(bp, mi, s, low[i if low.size > 1 else 0]) - \
            (offset >> np.uint64(s)) * mi
        bt_out[i] = bp >> np.uint64(63)


def _single_scaled_kernel(a: np.ndarray, b: np.ndarray, kappa: np.ndarray, rho: np.ndarray,
                          m: np.ndarray, sh: np.ndarray, low: np.ndarray, uk_out: np.ndarray,
                          t_out: np.ndarray) -> None:  # pragma: no cover
    """The single's side of a scaled truncation: A = a + b (b empty: A = a);
    Uk = floor(signed(A) m / 2^sh) - kappa; t = ((A >> 63) - rho) & low (t_out empty: not
    computed)."""
    n = a.size
    has_b = b.size == n
    exact = t_out.size == n
    for i in range(n):
        x = a[i] + b[i] if has_b else a[i]
        uk_out[i] = _mulshift_jit(x, m[i if m.size > 1 else 0], sh[i if sh.size > 1 else 0],
                                  np.uint64(0)) - kappa[i]
        if exact:
            t_out[i] = ((x >> np.uint64(63)) - rho[i]) & low[i if low.size > 1 else 0]


def _inject0_kernel(xa: np.ndarray, xb: np.ndarray, u: np.ndarray, kappa: np.ndarray,
                    rho1: np.ndarray, rho2: np.ndarray, m1: np.ndarray, m2: np.ndarray,
                    s0: np.ndarray) -> None:  # pragma: no cover
    """Bit injection, role 0; element i belongs to row i // c (c = xa.size // u.size):
    A = xa + xb, uA = u A; m1 = A - 2 uA - rho1, m2 = u - rho2, s0 = uA - kappa."""
    c = xa.size // u.size if u.size else 1
    for i in range(xa.size):
        ui = u[i // c]
        x = xa[i] + xb[i]
        ua = ui * x
        m1[i] = x - ua - ua - rho1[i]
        m2[i] = ui - rho2[i]
        s0[i] = ua - kappa[i]


def _inject_pair_kernel(bv: np.ndarray, beta: np.ndarray, p1: np.ndarray, p2: np.ndarray,
                        tau_own: np.ndarray, tau_other: np.ndarray, add: np.ndarray,
                        role1: bool, y: np.ndarray, s: np.ndarray,
                        s2: np.ndarray) -> None:  # pragma: no cover
    """Bit injection, roles 1 and 2, with sB = B - 2 beta B (beta of row i // c):
    role 1 (p1, p2 = V, u): y = beta V + u sB + beta B - tau_own;
    role 2 (p1, p2 = rho1, rho2): y = beta rho1 + rho2 sB - tau_own;
    s = add + y (kappa, or the received s0), s2 = tau_own + tau_other."""
    c = bv.size // beta.size if beta.size else 1
    for i in range(bv.size):
        bt = beta[i // c]
        b = bv[i]
        sb = b - bt * b - bt * b
        yi = bt * p1[i] + p2[i] * sb - tau_own[i]
        if role1:
            yi += bt * b
        y[i] = yi
        s[i] = add[i] + yi
        s2[i] = tau_own[i] + tau_other[i]


@once
def _kernels() -> tuple[tuple[Callable[..., None], ...], ...]:
    import numba
    globals()["_mulshift_jit"] = numba.njit(cache=True, nogil=True, inline="always")(_mulshift)
    return tuple(ring.jit_pair(k) for k in
                 (_split_kernel, _round2_kernel, _single_kernel, _final_kernel,
                  _inject0_kernel, _inject_pair_kernel, _split_scaled_kernel,
                  _single_scaled_kernel))


_ONE = np.ones(1, dtype=np.uint64)


def _arr(v, dtype) -> np.ndarray:
    return np.ascontiguousarray(np.atleast_1d(np.asarray(v, dtype=dtype)))


def pair_split(z: np.ndarray, other: np.ndarray | None, offset: np.uint64, sh, low, m=None,
               w_out: np.ndarray | None = None):
    """(W, bt) of the pair for its B = z (+ other) with the truncation's offset, shifts and
    low masks: :func:`_split_kernel` (adding ``low`` for the rounding), or with multipliers
    ``m`` :func:`_split_scaled_kernel`; ``w_out`` (contiguous uint64 of z's size, e.g. the
    output slot W ends in) receives W."""
    n = z.size
    w = np.empty(n, dtype=np.uint64) if w_out is None else _into(w_out, (n,))
    bt = np.empty(n, dtype=np.uint8)                                        # one bit each
    args = (np.ascontiguousarray(z), np.empty(0, np.uint64) if other is None else
            np.ascontiguousarray(other))
    offset, sh = np.uint64(offset), _arr(sh, np.int64)
    if m is None:
        _kernels()[0][n >= ring.NOGIL_MIN_WORK](
            *args, _arr(offset + low, np.uint64), sh, offset >> sh.view(np.uint64), w, bt)
    else:
        _kernels()[6][n >= ring.NOGIL_MIN_WORK](
            *args, offset, _arr(m, np.uint64), sh, _arr(low, np.uint64), w, bt)
    return w, bt


def pair_round2(w: np.ndarray, bt: np.ndarray, r: np.ndarray, nu_own: np.ndarray,
                nu_other: np.ndarray, low, up, m=None):
    """Updates ``w`` in place; returns (x, (x m) << up): see :func:`_round2_kernel`."""
    n = w.size
    x, xs = np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint64)
    _kernels()[1][n >= ring.NOGIL_MIN_WORK](
        w, np.ascontiguousarray(bt), np.ascontiguousarray(r), np.ascontiguousarray(nu_own),
        np.ascontiguousarray(nu_other), _arr(low, np.uint64), _arr(up, np.uint64),
        _ONE if m is None else _arr(m, np.uint64), x, xs)
    return x, xs


def single_split(a: np.ndarray, b: np.ndarray | None, kappa: np.ndarray, rho, sh, low,
                 m=None):
    """(U - kappa, t) of the single (role 0) for A = a (+ b): see :func:`_single_kernel`, or
    with multipliers ``m`` :func:`_single_scaled_kernel`; ``rho`` None: prob mode, t is
    None."""
    n = a.size
    uk = np.empty(n, dtype=np.uint64)
    t = np.empty(0 if rho is None else n, dtype=np.uint64)
    empty = np.empty(0, np.uint64)
    args = (np.ascontiguousarray(a), empty if b is None else np.ascontiguousarray(b),
            np.ascontiguousarray(kappa), empty if rho is None else np.ascontiguousarray(rho))
    scale = () if m is None else (_arr(m, np.uint64),)
    _kernels()[2 if m is None else 7][n >= ring.NOGIL_MIN_WORK](
        *args, *scale, _arr(sh, np.int64), _arr(low, np.uint64), uk, t)
    return uk, (None if rho is None else t)


def single_final(uk: np.ndarray, kappa: np.ndarray, x1: np.ndarray, x2: np.ndarray, up,
                 a_out: np.ndarray, b_out: np.ndarray, m=None) -> None:
    """a_out = Uk + ((x2 m) << up), b_out = kappa + ((x1 m) << up) (contiguous output
    views; m None: 1)."""
    _kernels()[3][uk.size >= ring.NOGIL_MIN_WORK](
        uk, np.ascontiguousarray(kappa), np.ascontiguousarray(x1), np.ascontiguousarray(x2),
        _arr(up, np.uint64), _ONE if m is None else _arr(m, np.uint64), a_out, b_out)


def _flat(v: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(v).reshape(-1)


def inject_single(xa, xb, u, kappa, rho1, rho2):
    """(m1, m2, s0) of role 0, shaped like xa: see :func:`_inject0_kernel` (u: row bits)."""
    shape, n = xa.shape, xa.size
    m1, m2, s0 = (np.empty(n, dtype=np.uint64) for _ in range(3))
    _kernels()[4][n >= ring.NOGIL_MIN_WORK](_flat(xa), _flat(xb), _flat(u), _flat(kappa),
                                           _flat(rho1), _flat(rho2), m1, m2, s0)
    return m1.reshape(shape), m2.reshape(shape), s0.reshape(shape)


def inject_pair(bv, beta, p1, p2, tau_own, tau_other, add, role1: bool, out=None):
    """(y, s, s2) of role 1 or 2, shaped like bv: see :func:`_inject_pair_kernel`; ``out``
    (two contiguous uint64 arrays shaped like bv, e.g. slices of the result's slots) receives
    s and s2 instead of fresh arrays."""
    shape, n = bv.shape, bv.size
    y = np.empty(n, dtype=np.uint64)
    s, s2 = (np.empty(n, dtype=np.uint64) for _ in range(2)) if out is None else \
        (_into(o, shape) for o in out)
    _kernels()[5][n >= ring.NOGIL_MIN_WORK](
        _flat(bv), _flat(beta), _flat(p1), _flat(p2), _flat(tau_own), _flat(tau_other),
        _flat(add), bool(role1), y, s, s2)
    return y.reshape(shape), s.reshape(shape), s2.reshape(shape)


def _into(out: np.ndarray, shape) -> np.ndarray:
    """A flat view of ``out`` for a kernel to write into (refused if that would be a copy)."""
    if out.dtype != np.uint64 or out.shape != shape or not out.flags.c_contiguous \
            or not out.flags.writeable:
        raise ValueError(f"an output array must be writable contiguous uint64 {shape}")
    return out.reshape(-1)
