"""GF(2^64) = GF(2)[X] / (X^64 + X^4 + X^3 + X + 1), the field of :mod:`mpc3.dzkp_bits`.

An element is one uint64 word (bit e the coefficient of X^e); addition is XOR, so additive
sharing is XOR sharing and every share is one word. Multiplication is the carry-less product
reduced by ``X^64 = X^4 + X^3 + X + 1``. Three forms, by what varies:

- two varying elements (:func:`mul`, the Gram sums of vectors): a carry-less product, the
  CPU's one instruction where it has one (x86-64's PCLMULQDQ: :func:`hardware_clmul`) or
  a 64-step loop (:func:`_clmul`), reduced once per sum (:func:`_reduce`: the reduction is
  linear);
- by a fixed element c (the folds' Lagrange coefficients): eight byte tables of c X^(8j) b
  (:func:`subset_tables` of c X^0 .. c X^63), eight lookups a product;
- a subset sum of 64 weights selected by the bits of a word (the weights of bit gates):
  the same byte tables, of the weights.

Scalars (a handful per proof step) use Python ints (:func:`mul_int`, :func:`inv_int`).
Kernels are numba-compiled lazily, as :mod:`mpc3.dzkp_kernels` does.
"""
from __future__ import annotations

import functools

import numpy as np

from .ringmm import once

#: X^64 = LOW (mod the field's polynomial): X^4 + X^3 + X + 1
LOW = 0x1B
_MASK = (1 << 64) - 1


# ------------------------------------------------------------------ scalars ----------
def mul_int(a: int, b: int) -> int:
    """The product of two field elements given as ints."""
    r = 0
    while b:
        if b & 1:
            r ^= a
        b >>= 1
        a = ((a << 1) & _MASK) ^ (LOW if a >> 63 else 0)
    return r


def inv_int(a: int) -> int:
    """a^-1 = a^(2^64 - 2); ZeroDivisionError for 0."""
    if a == 0:
        raise ZeroDivisionError("0 has no inverse in GF(2^64)")
    r, e = 1, (1 << 64) - 2
    while e:
        if e & 1:
            r = mul_int(r, a)
        a = mul_int(a, a)
        e >>= 1
    return r


def lagrange(nodes: list[int], x: int) -> np.ndarray:
    """L_i(x) for the distinct ``nodes`` (ints), as uint64 (len(nodes),): the barycentric
    form ``l(x) b_i / (x - w_i)``, b_i cached per node set, one inversion for all the
    denominators (:func:`_lagrange_at`)."""
    if x in nodes:
        return np.array([int(w == x) for w in nodes], dtype=np.uint64)
    key = tuple(nodes)
    out = np.empty(len(nodes), dtype=np.uint64)
    _kernels()["lagrange_at"](np.array(key, dtype=np.uint64), _bary(key), np.uint64(x), out)
    return out


@functools.cache
def _bary(nodes: tuple) -> np.ndarray:
    """b_i = 1 / prod_(j != i) (w_i - w_j) for each node."""
    out = np.empty(len(nodes), dtype=np.uint64)
    _kernels()["bary"](np.array(nodes, dtype=np.uint64), out)
    return out


@functools.cache
def node_lagrange(k: int, count: int) -> np.ndarray:
    """L_i(e) of the data nodes 0 .. k - 1 at the nodes e = 0 .. count - 1: (count, k)."""
    return np.stack([lagrange(list(range(k)), e) for e in range(count)])


def dot(coefs: np.ndarray, values: np.ndarray) -> int:
    """sum_i coefs[i] values[i] of two (n,) uint64 vectors, as an int."""
    return int(_kernels()["dot"](np.ascontiguousarray(coefs, dtype=np.uint64),
                                 np.ascontiguousarray(values, dtype=np.uint64)))


def at(values: np.ndarray, x: int) -> int:
    """The polynomial through ``values`` at the nodes 0 .. len - 1, evaluated at x."""
    return dot(lagrange(list(range(len(values))), x), values)


# ------------------------------------------------------------------ kernels ----------
def _clmul(a, b):  # pragma: no cover - compiled
    """The carry-less product of two uint64 as (low, high) words."""
    one = np.uint64(1)
    lo = (a & (np.uint64(0) - (b & one)))
    hi = np.uint64(0)
    for i in range(1, 64):
        m = np.uint64(0) - ((b >> np.uint64(i)) & one)
        lo ^= (a << np.uint64(i)) & m
        hi ^= (a >> np.uint64(64 - i)) & m
    return lo, hi


def hardware_clmul() -> bool:
    """Whether the kernels use the CPU's carry-less multiplication (PCLMULQDQ): on x86-64
    hosts that have it, with numba compiling for this host (``NUMBA_CPU_NAME`` unset or
    "host": a build for a generic CPU keeps the loop, as does ``NUMBA_DISABLE_JIT``).
    numba's disk cache is keyed by the CPU name and features, so each choice keeps its own
    compiled kernels."""
    import platform

    import llvmlite.binding as ll
    import numba

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    if numba.config.CPU_NAME not in (None, "host") or numba.config.DISABLE_JIT:
        return False
    return bool(ll.get_host_cpu_features().get("pclmul"))


@functools.cache
def _pclmul():
    """A numba intrinsic: the carry-less product of two uint64 as (low, high) words, by
    LLVM's ``llvm.x86.pclmulqdq`` on the low lanes of two 128-bit vectors."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def clmul(typingctx, a, b):
        sig = types.UniTuple(types.uint64, 2)(types.uint64, types.uint64)

        def codegen(context, builder, signature, args):
            i64, i32 = ir.IntType(64), ir.IntType(32)
            v2 = ir.VectorType(i64, 2)
            lane = [ir.Constant(i32, j) for j in (0, 1)]
            va, vb = (builder.insert_element(ir.Constant(v2, [0, 0]), x, lane[0])
                      for x in args)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(v2, [v2, v2, ir.IntType(8)]),
                "llvm.x86.pclmulqdq")
            r = builder.call(fn, [va, vb, ir.Constant(ir.IntType(8), 0)])
            return context.make_tuple(builder, signature.return_type,
                                      [builder.extract_element(r, j) for j in lane])
        return sig, codegen
    return clmul


def _reduce(lo, hi):  # pragma: no cover
    """lo + hi X^64 reduced: hi X^64 = hi (X^4 + X^3 + X + 1), whose top bits fold once more."""
    t = (hi >> np.uint64(63)) ^ (hi >> np.uint64(61)) ^ (hi >> np.uint64(60))
    hi ^= t
    return lo ^ hi ^ (hi << np.uint64(1)) ^ (hi << np.uint64(3)) ^ (hi << np.uint64(4))


def _mul(a, b):  # pragma: no cover
    lo, hi = _clmul_jit(a, b)
    return _reduce_jit(lo, hi)


def _mul_vec(a, b, out):  # pragma: no cover
    for i in range(a.size):
        out[i] = _mul_jit(a[i], b[i])


def _dot(a, b):  # pragma: no cover
    lo, hi = np.uint64(0), np.uint64(0)
    for i in range(a.size):
        x, y = _clmul_jit(a[i], b[i])
        lo ^= x
        hi ^= y
    return _reduce_jit(lo, hi)


def _inv(a):  # pragma: no cover
    """a^(2^64 - 2), a != 0."""
    r = np.uint64(1)
    for _ in range(63):                  # r = a^(2^63 - 1) by squares, then squared
        r = _mul_jit(_mul_jit(r, r), a)
    return _mul_jit(r, r)


def _lagrange_at(nodes, bary, x, out):  # pragma: no cover
    """out[i] = l(x) bary[i] / (x - nodes[i]), x not a node (Montgomery's trick)."""
    k = nodes.size
    pre = np.empty(k + 1, dtype=np.uint64)
    pre[0] = 1
    for i in range(k):
        pre[i + 1] = _mul_jit(pre[i], x ^ nodes[i])
    lx = pre[k]
    inv = _inv_jit(lx)
    for i in range(k - 1, -1, -1):                   # inv = 1 / prod_(j <= i) (x - w_j)
        out[i] = _mul_jit(_mul_jit(_mul_jit(inv, pre[i]), lx), bary[i])
        inv = _mul_jit(inv, x ^ nodes[i])


def _bary_weights(nodes, out):  # pragma: no cover
    for i in range(nodes.size):
        d = np.uint64(1)
        for j in range(nodes.size):
            if j != i:
                d = _mul_jit(d, nodes[i] ^ nodes[j])
        out[i] = _inv_jit(d)


def _subset_table(vals, out):  # pragma: no cover
    """out[j, b] = XOR of vals[8 j + s] over the set bits s of b; vals (64,), out (8, 256)."""
    for j in range(8):
        out[j, 0] = 0
        for b in range(1, 256):
            low = b & -b
            s = 0
            while (1 << s) != low:
                s += 1
            out[j, b] = out[j, b ^ low] ^ vals[8 * j + s]


def _lookup(tab, w):  # pragma: no cover
    """XOR of the table's values selected by the bits of word w (tab: :func:`_subset_table`)."""
    acc = np.uint64(0)
    for j in range(8):
        acc ^= tab[j, (w >> np.uint64(8 * j)) & np.uint64(255)]
    return acc


def _powers(c, out):  # pragma: no cover
    """out[e] = c X^e for e < 64."""
    low = np.uint64(LOW)
    for e in range(64):
        out[e] = c
        top = c >> np.uint64(63)
        c = (c << np.uint64(1)) ^ (low & (np.uint64(0) - top))


def _const_tables(cs, out):  # pragma: no cover
    """out[i] = the byte tables of multiplication by cs[i]: (len, 8, 256)."""
    pw = np.empty(64, dtype=np.uint64)
    for i in range(cs.size):
        _powers_jit(cs[i], pw)
        _subset_table_jit(pw, out[i])


def _fold_field(X, k, n, tabs, out):  # pragma: no cover
    """out[t] = sum_i c_i X[i n + t] (zero past X's end), tabs the c_i's byte tables."""
    N = X.size
    for t in range(n):
        acc = np.uint64(0)
        for i in range(k):
            idx = i * n + t
            if idx < N:
                acc ^= _lookup_jit(tabs[i], X[idx])
        out[t] = acc


def _gram_field(U, V, k, n, lo, hi):  # pragma: no cover
    """Unreduced lo/hi[p] = sum_t (U_i + U_i')(V_i + V_i') for the pairs p = (i <= i')
    (U_i V_i on the diagonal), chunk i of n elements, zero past the end."""
    N = U.size
    a = np.zeros(k, dtype=np.uint64)
    b = np.zeros(k, dtype=np.uint64)
    for t in range(n):
        for i in range(k):
            idx = i * n + t
            a[i] = U[idx] if idx < N else np.uint64(0)
            b[i] = V[idx] if idx < N else np.uint64(0)
        p = 0
        for i in range(k):
            for i2 in range(i, k):
                x, y = a[i], b[i]
                if i2 != i:
                    x ^= a[i2]
                    y ^= b[i2]
                cl, ch = _clmul_jit(x, y)
                lo[p] ^= cl
                hi[p] ^= ch
                p += 1


_clmul_jit = _clmul
_reduce_jit = _reduce
_mul_jit = _mul
_lookup_jit = _lookup
_powers_jit = _powers
_subset_table_jit = _subset_table
_inv_jit = _inv


def bind_jit(g: dict, names) -> None:
    """Compile each of ``names`` in the module globals ``g`` (numba, disk-cached, GIL-free)
    into the ``<name>_jit`` the other kernels call (its Python form until then)."""
    import numba

    for name in names:
        g[name + "_jit"] = numba.njit(cache=True, nogil=True)(g[name])


@once
def _kernels() -> dict:
    """Compile lazily (disk-cached)."""
    import numba

    g = globals()
    jit = numba.njit(cache=True, nogil=True)
    bind_jit(g, ("_clmul", "_reduce", "_mul", "_inv", "_lookup", "_powers", "_subset_table"))
    if hardware_clmul():             # bound before anything that calls it is compiled
        g["_clmul_jit"] = _pclmul()
    return {"mul_vec": jit(_mul_vec), "dot": jit(_dot), "const_tables": jit(_const_tables),
            "fold_field": jit(_fold_field), "gram_field": jit(_gram_field),
            "reduce": g["_reduce_jit"], "subset_table": g["_subset_table_jit"],
            "lookup": g["_lookup_jit"], "lagrange_at": jit(_lagrange_at),
            "bary": jit(_bary_weights)}


# --------------------------------------------------------------- vector forms --------
def _u64(x) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.uint64)


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise product of two uint64 arrays of one shape."""
    a, b = np.broadcast_arrays(_u64(a), _u64(b))
    a, b = _u64(a), _u64(b)
    out = np.empty(a.shape, dtype=np.uint64)
    _kernels()["mul_vec"](a.reshape(-1), b.reshape(-1), out.reshape(-1))
    return out


def const_tables(cs: np.ndarray) -> np.ndarray:
    """Byte tables of multiplication by each of ``cs``: (len, 8, 256) uint64."""
    cs = _u64(cs).reshape(-1)
    out = np.empty((cs.size, 8, 256), dtype=np.uint64)
    _kernels()["const_tables"](cs, out)
    return out


def fold(X: np.ndarray, coefs: np.ndarray, k: int) -> np.ndarray:
    """sum_i coefs[i] X_i over the k chunks X_i of ceil(len / k) elements (zero-padded)."""
    X = _u64(X)
    n = -(-X.size // k)
    out = np.empty(n, dtype=np.uint64)
    _kernels()["fold_field"](X, k, n, const_tables(coefs), out)
    return out


def gram(U: np.ndarray, V: np.ndarray, k: int) -> np.ndarray:
    """T[(i, i')] = G[i, i'] + G[i', i] for i < i', G[i, i] on the diagonal (pairs in
    :func:`mpc3.dzkp_kernels.pairs` order), G[i, i'] = sum_t U_it V_i't over k chunks."""
    U, V = _u64(U), _u64(V)
    n = -(-U.size // k)
    P = k * (k + 1) // 2
    lo, hi = np.zeros(P, dtype=np.uint64), np.zeros(P, dtype=np.uint64)
    kern = _kernels()
    kern["gram_field"](U, V, k, n, lo, hi)
    T = np.array([kern["reduce"](a, b) for a, b in zip(lo, hi)], dtype=np.uint64)
    diag = {i: T[p] for p, (i, i2) in enumerate(_pairs(k)) if i == i2}
    for p, (i, i2) in enumerate(_pairs(k)):       # (U_i + U_i')(V_i + V_i') - both diagonals
        if i != i2:
            T[p] ^= diag[i] ^ diag[i2]
    return T


@functools.cache
def _pairs(k: int) -> tuple:
    return tuple((i, i2) for i in range(k) for i2 in range(i, k))
