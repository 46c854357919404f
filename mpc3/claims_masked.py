"""The claims of an injection of masked 3-out-of-3 bits (:func:`mpc3.kernels.convert.
inject_steps` with ``from_masked``): the injection's own messages, read with the single's bit
split between its two neighbours, and the pair's swap of its halves - built at the flush,
after the claims of the kernel that made the bits, by that kernel's ``parts`` and ``swaps``:

* thresholds' comparison (:mod:`mpc3.claims_compare`: ``bit_parts``, ``swap_claims``);
* the carry tree's last AND layer kept 3-out-of-3 (:func:`mpc3.kernels.convert._carry_steps`
  fused; here). Party P's share ``e_P = x_a y_a ^ x_a y_b ^ x_b y_a ^ f_next ^ f_prev ^ l_a``
  (l the layer's linear term, G_hi ^ c) is an AND layer's claim with e_P in place of the
  reshared message, read mod 2 (u and z lifted by 2^63): its cross terms are products of
  what V_L and V_R hold. The pair's halves are messages of the swap (role 1's to role 2,
  role 2's to role 1); the single's is never sent, so at the flush it sends ``w = e_0 ^ pad`` (one bit
  per element, the pad from its key with V_L) to V_R, and its bit is ``pad ^ w`` - split
  between its neighbours as the injection's claims need.
"""
from __future__ import annotations

import numpy as np

from .claims import Views, injection_claims
from .claims_compare import _sided, mod2
from .kernels.boolean import word_slices
from .kernels.convert import _bits_u64
from .shares import group_sizes, words


def masked_injection_claims(p, rec: dict, _witness) -> list:
    """(own, as V_L, as V_R) triples of an injection of masked bits whose maker is
    ``rec["origin"]`` (its record, ``parts`` and ``swaps``)."""
    origin, st = rec["origin"], rec["st"]
    made, parts, swaps = origin["rec"], origin["parts"], origin["swaps"]
    swapped = Views()
    for g, s in enumerate(st):
        e_in = s["beta"] ^ _bits_u64(s["e"], s["n"]) if s["role"] else None
        for pos, claims in swaps(p, made, g, s["role"], e_in):
            swapped.add_all(pos, claims)
    return injection_claims(p, rec["x"], None, st, rec["got2"], seg=rec["seg"],
                            parts=lambda g, role: parts(p, made, g, role)) + swapped.triples()


# ------------------------------------------------------------- the fused AND layer ----
def _pad(p, rec: dict, g: int, stream: str) -> np.ndarray:
    ng = group_sizes(rec["x"].n)[g]
    raw = p.prg.bytes(stream, rec["kop"], f"treewit{g}", 8 * words(ng))
    return _bits_u64(raw.view(np.uint64)[None], ng)


def tree_witness(p, rec: dict) -> np.ndarray:
    """The single's witness: its share of the group where this party is role 0 (rank g),
    xor the pad it shares with V_L, as bit planes (one bit per element)."""
    g = p.rank
    wsl = word_slices(group_sizes(rec["x"].n))[g]
    raw = p.prg.bytes("prev", rec["kop"], f"treewit{g}", 8 * (wsl.stop - wsl.start))
    return rec["planes"][0, wsl] ^ raw.view(np.uint64)


def tree_keep(p, rec: dict, witness: np.ndarray) -> list:
    """Keep the witness received (the single's of the group where this party is role 1);
    the claims come with the injection (:func:`tree_swaps`)."""
    rec["wit"] = witness
    return []


def _group_bits(p, rec: dict, g: int) -> dict:
    """This party's slots of the layer's operands, linear term and masks in group g."""
    n = rec["x"].n
    wsl, ng = word_slices(group_sizes(n))[g], group_sizes(n)[g]
    out = {}
    for name in ("x", "y", "lin"):
        v = rec[name]
        out[name + "a"] = _bits_u64(v.a[:, wsl], ng)
        out[name + "b"] = _bits_u64(v.b[:, wsl], ng)
    if "masks" not in rec:                   # and_local's zero sharing, drawn once
        W = rec["x"].a.shape[1]
        rec["masks"] = {stream: p.prg.bytes(stream, rec["kop"], rec["tag"], 8 * W)
                        .view(np.uint64)[None] for stream in ("next", "prev")}
    for stream, raw in rec["masks"].items():
        out[stream] = _bits_u64(raw[:, wsl], ng)
    return out


def tree_parts(p, rec: dict, g: int, role: int):
    """The single's bit of group g as (V_L's pad, V_R's witness) (None where not held)."""
    ng = group_sizes(rec["x"].n)[g]
    pad = _pad(p, rec, g, "prev" if role == 0 else "next") if role in (0, 2) else None
    if role == 0:
        return pad, _bits_u64(rec["planes"][:, word_slices(group_sizes(rec["x"].n))[g]],
                              ng) ^ pad
    wit = rec.get("wit", np.zeros(0, np.uint64))
    w = _bits_u64(wit[None], ng) if wit.size == words(ng) else np.zeros(ng, np.uint64)
    return (pad, None) if role == 2 else (None, w)


def tree_swaps(p, rec: dict, g: int, role: int, e_in) -> list:
    """(pos, {"bits": ...}) of the three shares of group g: each is the AND claim with the
    share, split between V_L and V_R, in place of a message (module docstring)."""
    b = _group_bits(p, rec, g)
    zero = np.zeros(group_sizes(rec["x"].n)[g], dtype=np.uint64)
    out = []
    for prover in range(3):
        pos = (role - prover) % 3
        if prover == 0:                      # the single's share: pad ^ witness
            el, er = tree_parts(p, rec, g, role)
        elif prover == 1:                    # role 1's half went to role 2 (V_R)
            el, er = zero, (_own(rec, g) if pos == 0 else e_in)
        else:                                # role 2's half went to role 1 (V_L)
            el, er = (_own(rec, g) if pos == 0 else e_in), zero

        def left(el=el):                     # the prover's slot a: V_L's b
            xa, ya, la, fp = ((b["xa"], b["ya"], b["lina"], b["prev"]) if pos == 0 else
                              (b["xb"], b["yb"], b["linb"], b["next"]))
            return mod2(np.stack([xa, ya]), (xa & ya) ^ fp ^ la ^ el)

        def right(er=er):                    # the prover's slot b: V_R's a
            xb, yb, fn = ((b["xb"], b["yb"], b["next"]) if pos == 0 else
                          (b["xa"], b["ya"], b["prev"]))
            return mod2(np.stack([yb, xb]), fn ^ er)
        out.append((pos, _sided(pos, left, right)))
    return out


def _own(rec: dict, g: int) -> np.ndarray:
    n = rec["x"].n
    return _bits_u64(rec["planes"][:, word_slices(group_sizes(n))[g]], group_sizes(n)[g])
