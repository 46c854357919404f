"""Malicious mode over the whole kernel catalog: every kernel either is verified - the
flush accepts it, its value is the semi-honest one within the kernel's bound, and a changed
message in it aborts - or is refused at the flush with Unverified; nothing runs unchecked
and nothing else happens. VERIFIED is the coverage docs/MALICIOUS.md states."""
import numpy as np
import pytest

from mpc3 import dzkp, tamper
from mpc3.checks import Checks, Unverified
from mpc3.kernels import catalog
from mpc3.party import RingConfig
from mpc3.sim import make_parties, run_parties

#: every kernel but the resharing of a 3-out-of-3 input, which no other party's values
#: determine (it is verified inside the kernels that produce such an input, never alone)
VERIFIED = set(catalog.KERNELS) - {"reshare"}
N, SHAPE = 64, (8, 16, 8)


def _case(name):
    kernel = catalog.KERNELS[name]
    cfg = RingConfig()
    rng = np.random.default_rng([N, len(name), ord(name[0])])
    plain = kernel.plaintext(rng, N, SHAPE, cfg)
    return kernel, cfg, plain, kernel.deal(plain, cfg, rng)


def _job(kernel, seen=None):
    def job(p, *shares):
        p.checks = Checks(p)
        out = kernel.run(p, *shares)
        if seen is not None:
            seen[p.rank] = p.comm.op                 # the kernel's last round
        p.checks.flush(p)
        return out
    return job


@pytest.mark.parametrize("name", list(catalog.KERNELS))
def test_every_catalog_kernel_is_verified_or_refused(name):
    kernel, cfg, plain, shares = _case(name)
    if name not in VERIFIED:
        with pytest.raises(Unverified, match="no verification yet"):
            run_parties(_job(kernel), shares, parties=make_parties(cfg))
        return
    seen = {}
    clean = tamper.run(_job(kernel, seen), shares, make_parties(cfg))
    assert clean.error is None, clean.error
    err = np.abs(kernel.value(clean.results, cfg) - kernel.reference(*plain))
    assert (err <= kernel.bound(plain, cfg)).all()
    rng = np.random.default_rng(len(name))
    kernel_msgs = [s for s in clean.sent if s.op <= seen[s.party] and s.entries]
    target = tamper.draw(kernel_msgs, rng, "add")
    got = tamper.run(_job(kernel), shares, make_parties(cfg), target,
                     tamper.Deviation("add", error=int(rng.integers(1, 1 << 62)), seed=1))
    assert isinstance(got.error, dzkp.CheatingDetected), (target, got.error)
