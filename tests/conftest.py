import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mpc3 import ring
from mpc3.party import RingConfig
from mpc3.sharing import deal, reveal
from mpc3.sim import make_parties, run_parties

ROOT = Path(__file__).resolve().parent.parent
#: tests/: one folder per room of the code (tests/mpc3/, tests/protocols/model/, ...,
#: tests/system/; docs/DESIGN.md), none a package. On sys.path whatever pytest's import
#: mode, so every test module finds conftest.py and helpers/ by name (no test module
#: imports another: what two share is in helpers/).
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


def pytest_sessionstart(session):
    """pytest imports a test module by its basename (no __init__.py under tests/), so two
    test modules of one name in two rooms would collide: refuse that before collecting."""
    rooms = {}
    for path in TESTS.rglob("test_*.py"):
        rooms.setdefault(path.name, []).append(str(path.parent.relative_to(TESTS)))
    twice = {name: sorted(where) for name, where in rooms.items() if len(where) > 1}
    if twice:
        raise pytest.UsageError(f"test modules share a basename, rename one: {twice}")


def mpc3_cli(*args, timeout: float = 300):
    """``python -m app.cli ARGS`` in a fresh process, this checkout first on its path: the
    completed process, its output captured as text."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], env=env,
                          text=True, capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A cluster CA and certificates (net.keys.generate), once per test module."""
    from net import keys
    d = tmp_path_factory.mktemp("certs")
    keys.generate(d)
    return d


@pytest.fixture
def tls_mesh(certs):
    """Three peer routers in this process over TLS socket links on loopback."""
    from net.peer import mesh
    routers, stop = mesh.local_mesh(certs, transport="tls")
    yield routers
    stop()


def failure_allowance(n: int, p: float, tail: float = 1e-9) -> int:
    """How many of n independent events of probability at most p a test may meet: the
    smallest k with P(Poisson(n p) > k) < tail (the Poisson tail bounds the binomial's for
    small p). A prob-mode check allows this many failures, so it fails by chance about once
    in 1/tail runs however often CI runs it, yet still catches a rate far above the claim."""
    mean, k, cdf = n * p, 0, math.exp(-n * p)
    term = cdf
    while 1.0 - cdf >= tail:
        k += 1
        term *= mean / k
        cdf += term
    return k


def prob_trunc_allowance(z, tail: float = 1e-9) -> int:
    """failure_allowance for "prob" truncations of the ring values z (the untruncated
    integers, e.g. a product x y 2^(2 frac)): each fails with the documented probability
    ~|z| / 2^64 (mpc3.kernels.truncation; measured by tests/mpc3/test_kernels_ranges.py::
    test_prob_products_fail_with_documented_probability), so the Poisson mean is the sum."""
    p = np.abs(np.asarray(z, dtype=np.float64)).reshape(-1) / 2.0 ** 64
    return failure_allowance(p.size, float(p.mean()), tail) if p.size else 0


class Run:
    """Run an SPMD function on three in-process parties and keep their traffic."""

    def __init__(self, cfg=None):
        self.cfg = cfg or RingConfig()

    def __call__(self, fn, *shared_args):
        self.parties = make_parties(self.cfg)
        args = [tuple(a[i] for a in shared_args) for i in range(3)]
        return run_parties(fn, args, parties=self.parties)

    @property
    def bytes_per_party(self):
        return tuple(p.stats.bytes_sent for p in self.parties)

    @property
    def rounds(self):
        return max(p.stats.rounds for p in self.parties)

    def assert_cost(self, cost):
        assert self.bytes_per_party == cost.bytes_per_party
        assert self.rounds == cost.rounds


@pytest.fixture
def run():
    return Run()


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def make_cfg(**kw):
    """A small encoder-decoder config (d 24, 3 heads, 2 + 2 layers) with ``kw`` changed;
    the tests' common base model."""
    from protocols import model as M
    base = dict(d_model=24, n_heads=3, d_head=8, n_features=10, d_ff=40, n_enc_layers=2,
                n_dec_layers=2, attn_c=0.5, attn_norm="mean", norm_first=False,
                src_vocab=5, tgt_vocab=5, max_len=16)
    base.update(kw)
    return M.ModelConfig(**base).validate()


def share(x, frac=ring.DEFAULT_FRAC):
    return deal(ring.encode(np.asarray(x, dtype=float), frac))


def value(shares, frac=ring.DEFAULT_FRAC):
    return ring.decode(reveal(shares), frac)


def lm_run(run, cfg, shares, x, prompt: int, **prefill_kw):
    """protocols.stacks.causal_lm on three in-process parties: the prefill of ``x[:, :prompt]``
    then one step per further row of x. Returns (revealed hidden rows, prefill's then each
    step's; ``{t: (bytes per party, rounds)}`` of the prefill (t = -1) and of each step t;
    party 0's LMState at the end)."""
    from protocols.stacks import causal_lm as LM
    measured, states = {}, {}

    def fn(p, s, xs):
        c0 = p.stats.snapshot()
        h, st = LM.lm_prefill(p, cfg, s, xs[:, :prompt], **prefill_kw)
        measured.setdefault(-1, {})[p.rank] = p.stats.snapshot() - c0
        hs = [h]
        for t in range(prompt, xs.shape[1]):
            c0 = p.stats.snapshot()
            hs.append(LM.lm_step(p, cfg, s, st, xs[:, t]))
            measured.setdefault(t, {})[p.rank] = p.stats.snapshot() - c0
        states[p.rank] = st
        return hs

    res = run(fn, shares, share(x))
    rows = [value([r[k] for r in res]) for k in range(len(res[0]))]
    return rows, {t: (tuple(m[r].bytes_sent for r in range(3)), max(v.rounds for v in m.values()))
                  for t, m in measured.items()}, states[0]


def assert_lm_costs(cfg, measured, batch: int, prompt: int) -> None:
    """:func:`lm_run`'s measured costs equal the declared ones (cost_lm_prefill at t = -1,
    cost_lm_step at each step t)."""
    from protocols.stacks import causal_lm as LM
    rc = RingConfig()
    for t, got in measured.items():
        declared = (LM.cost_lm_prefill(rc, cfg, batch, prompt) if t < 0
                    else LM.cost_lm_step(rc, cfg, batch, t))
        assert got == (declared.bytes_per_party, declared.rounds), t


def lm_session(run, cfg, shares, x, prompt: int, **prefill_kw):
    """:func:`lm_run` without the prefill's cost and the state: (rows, ``{t: (bytes per
    party, rounds)}`` of each step t)."""
    rows, costs, _ = lm_run(run, cfg, shares, x, prompt, **prefill_kw)
    return rows, {t: c for t, c in costs.items() if t >= 0}


def share_inputs(x, name="X"):
    """Each party's inputs of a job: ``x`` encoded and dealt as ``name``."""
    dealt = deal(ring.encode(x, ring.DEFAULT_FRAC))
    return [{name: dealt[n]} for n in range(3)]


def run_job(parties, kind, x):
    """Job ``kind`` on :class:`net.party.inproc.InprocParties` with input X = ``x``: (decoded
    outputs, the three parties' jobs)."""
    from net.client.outputs import reconstruct
    jobs = parties.run(kind, {}, share_inputs(x))
    return {k: ring.decode(v) for k, v in reconstruct([j.outputs for j in jobs]).items()}, jobs


EDGE = np.array([0.0, 2.0 ** -18, -2.0 ** -18, 1e-3, -1e-3, 1.0, -1.0, 1000.0, -1000.0,
                 12345.678, -12345.678, 16383.0, -16383.0])


def netns_skip_reason():
    """Why network-namespace tests cannot run here, or None when they can."""
    import os
    import shutil
    import subprocess
    if os.geteuid() != 0:
        return "network emulation needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) not installed"
    name = f"mpc3-{os.getpid()}-skipprobe"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        return "ip netns add not permitted here"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def stop_processes(procs, grace: float = 10.0) -> None:
    """Terminate party processes, killing those that do not exit within ``grace`` s."""
    import subprocess
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
