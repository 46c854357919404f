"""A party's compiled kernels, built (or loaded from numba's disk cache) before it serves, so
that no job waits for a compiler.

Numba compiles a kernel for the argument types of its first call, separately for each of its
compilations: the GIL-holding and GIL-free forms of a kernel (:func:`mpc3.ring.jit_pair`,
chosen by the call's size), the serial and parallel forms of the matrix products and of the
proof's kernels (parallel only for large work in a party alone in its process). A warm-up on
small operands with three parties in one process reaches only the small, serial forms; the
first real job then compiled the rest. Measured on the Table 2 encoder layer over three party
processes on the emulated LAN, each party cache empty and the parties warmed up as before this
module (the catalog's kernels at two small sizes), with two campaigns loading the machine: the
first job took 65.8 s semi-honest and 105 s malicious, against 0.84 s and 10.8 s once compiled
(docs/PERFORMANCE.md, "The first job").

So :func:`warm_up` runs the catalog's kernels (and, for a malicious cluster, each verified, so
the proof's kernels compile too), calls each matrix-product kernel once, and then builds every
registered twin of each compiled kernel for the same argument types
(:func:`mpc3.ringmm.compile_twins`).
"""
from __future__ import annotations

import numpy as np

from . import ringmm
from .party import RingConfig


def warm_up(security: str = "semi-honest", cfg: RingConfig | None = None) -> int:
    """Compile what a job in ``security`` mode can reach; the number of compiled kernel forms
    (signatures of every numba dispatcher) this process then holds."""
    from .kernels import catalog

    if security not in ("semi-honest", "malicious"):
        raise ValueError(f"security must be semi-honest or malicious, not {security!r}")
    cfg = cfg or RingConfig()
    catalog.warm_up(cfg)
    if security == "malicious":
        _verified(cfg)
    ringmm.warm_up()
    ringmm.compile_twins()
    return sum(compiled_forms().values())


def compiled_forms() -> dict:
    """Every numba dispatcher of this process: how many signatures it has compiled or loaded
    (numba's compile event does not fire for those loaded from the disk cache)."""
    import gc

    from numba.core.dispatcher import Dispatcher
    return {d: len(d.signatures) for d in gc.get_objects() if issubclass(type(d), Dispatcher)}


def _verified(cfg: RingConfig) -> None:
    """Every verified catalog kernel in one malicious-mode job with one flush for all: what
    compiles the proofs' kernels."""
    from .checks import Checks
    from .kernels import catalog
    from .sim import make_parties, run_parties

    rng = np.random.default_rng(0)
    n, shape = catalog.WARM_UP_SIZES[-1]
    kernels = [k for name, k in catalog.KERNELS.items() if name not in catalog.UNVERIFIED]
    dealt = [k.deal(k.plaintext(rng, n, shape, cfg), cfg, rng) for k in kernels]

    def job(p, *shares):
        p.checks = Checks(p)
        for kernel, args in zip(kernels, shares):
            kernel.run(p, *args)
        p.checks.flush(p)

    run_parties(job, [tuple(d[r] for d in dealt) for r in range(3)], parties=make_parties(cfg))
