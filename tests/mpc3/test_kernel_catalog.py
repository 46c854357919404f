"""Every kernel of mpc3.kernels.catalog on three in-process parties: its value against the
float64 reference within the documented tolerance, and the measured bytes per party and
rounds equal to its declared cost exactly - in both truncation modes and at two sizes
(sqrt-inv switches from its table form to Newton above FAST_ROWS inputs).

The PRG seeds and shares are fixed (the test-only ``seed`` option) so the prob-mode runs,
whose documented failure events have probabilities up to ~2e-4 per element at range
edges, are reproducible; fresh randomness is exercised by the other kernel tests.
"""
import numpy as np
import pytest

from mpc3.kernels import catalog, fxp
from mpc3.party import RingConfig
from mpc3.sim import make_parties, run_parties

SIZES = {7: (3, 5, 4), 64: (8, 16, 8)}          # elements, and matmul's MxKxN


@pytest.mark.parametrize("mode", ["exact", "prob"])
@pytest.mark.parametrize("n", sorted(SIZES))
@pytest.mark.parametrize("name", list(catalog.KERNELS))
def test_kernel_value_and_declared_cost(name, n, mode):
    kernel = catalog.KERNELS[name]
    cfg = RingConfig(trunc=mode)
    rng = np.random.default_rng([n, len(name), ord(name[0]), mode == "prob"])
    plain = kernel.plaintext(rng, n, SIZES[n], cfg)
    parties = make_parties(cfg, seed=f"catalog/{name}/{n}/{mode}".encode())
    out = run_parties(kernel.run, kernel.deal(plain, cfg, rng), parties=parties)

    err = np.abs(kernel.value(out, cfg) - kernel.reference(*plain))
    bound = kernel.bound(plain, cfg)
    assert (err <= bound).all(), (np.max(err - bound), plain)

    cost = kernel.cost_of(plain, cfg)
    assert tuple(p.stats.bytes_sent for p in parties) == cost.bytes_per_party
    assert max(p.stats.rounds for p in parties) == cost.rounds


def test_generators_respect_the_documented_ranges():
    rng = np.random.default_rng(0)
    lo, hi = fxp.SQRT_INV_RANGE
    x, = catalog.KERNELS["sqrt-inv"].plaintext(rng, 500)
    assert x.min() == lo and x.max() == hi
    x, = catalog.KERNELS["exp"].plaintext(rng, 500)
    assert (x.min(), x.max()) == fxp.EXP_RANGE
    x, = catalog.KERNELS["drelu"].plaintext(rng, 5000)
    drop = 2.0 ** (RingConfig().relu_drop_bits - RingConfig().frac)
    assert np.abs(x).max() < 2 ** 14 and not ((x < 0) & (x >= -drop)).any()
    x, y = catalog.KERNELS["mult"].plaintext(rng, 500)
    assert 0.98 * 2 ** 26 < np.abs(x * y).max() < 2 ** 26


def test_bench_op_lists_and_runs_every_catalog_kernel():
    """``mpc3 bench op`` takes its op list, workloads and references from the catalog and
    reports the declared traffic."""
    from app.bench import op as cli_bench
    assert tuple(cli_bench.OPS) == tuple(catalog.KERNELS)
    cfg = RingConfig()
    for name, kernel in catalog.KERNELS.items():
        r = cli_bench.run_op(name, 10, (2, 3, 2), 1, cfg)
        shapes = (2, 3, 2) if name == "matmul" else None
        assert r["workload"] == f"op/{name}" and r["params"]["shape"] == (
            list(shapes) if shapes else None)
        plain = kernel.plaintext(np.random.default_rng(0), 10, (2, 3, 2), cfg)
        cost = kernel.cost_of(plain, cfg)
        assert r["bytes_per_party"] == list(cost.bytes_per_party) and r["rounds"] == cost.rounds
        assert r["max_abs_err"] <= np.max(kernel.bound(plain, cfg)) + 1e-12
