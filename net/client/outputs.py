"""What the query user does with the three parties' output shares: check every replica and
the scale each party says its shares carry, then reconstruct (:func:`reconstruct`)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from mpc3 import ring
from mpc3.shares import AShare

from .failures import TamperingDetected


def same_scales(fracs: list[Mapping[str, int]], frac: int) -> dict[str, int]:
    """The fractional bits each party's chunks gave every output (``fracs[party][name]``)
    -> the outputs carried with more than ``frac`` (wide, ``TensorSpec.wide``) and how many
    more; the parties must agree."""
    if any(f != fracs[0] for f in fracs[1:]):
        raise TamperingDetected(f"parties returned outputs of different fixed-point scales: "
                                f"{list(fracs)}")
    return {k: f - frac for k, f in fracs[0].items() if f != frac}


def reconstruct(pairs: list[Mapping[str, AShare]],
                wide: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Ring values from the three parties' output pairs, checking every replica; ``wide``:
    outputs carried with that many fractional bits more (an untruncated last product,
    ``TensorSpec.wide``), rounded to the cluster's frac here."""
    names = set(pairs[0])
    if any(set(p) != names for p in pairs):
        raise TamperingDetected("parties returned different output tensors: "
                                f"{[sorted(p) for p in pairs]}")
    out = {}
    for name in sorted(names):
        s = [p[name] for p in pairs]
        if len({x.shape for x in s}) != 1:
            raise TamperingDetected(f"output {name!r}: parties returned different shapes")
        for i in range(3):
            j = (i + 1) % 3
            if not np.array_equal(s[i].b, s[j].a):
                raise TamperingDetected(f"output {name!r}: the copies of share slot {j} held "
                                        f"by party {i} and party {j} disagree")
        out[name] = ring.narrow(s[0].a + s[1].a + s[2].a, (wide or {}).get(name, 0))
    return out
