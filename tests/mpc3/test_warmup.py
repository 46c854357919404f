"""A party's warm-up (mpc3.warmup) leaves nothing for a job to compile: every size's form of a
kernel (GIL-holding, GIL-free, parallel) has the argument types another form was compiled
for, and a job larger than the warm-up's - so taking the GIL-free and parallel forms - in
malicious mode compiles nothing."""
import numpy as np
import pytest

from mpc3 import ringmm, warmup
from mpc3.checks import Checks
from mpc3.kernels import catalog
from mpc3.party import RingConfig
from mpc3.sim import make_parties, run_parties


@pytest.fixture(scope="module")
def warm():
    return warmup.warm_up("malicious")


def test_every_form_of_a_kernel_has_every_signature_of_its_twins(warm):
    assert warm == sum(warmup.compiled_forms().values()) >= sum(map(len, ringmm._TWINS))
    assert ringmm._TWINS, "no kernel registered its forms"
    for group in ringmm._TWINS:
        sigs = [set(d.signatures) for d in group]
        assert sigs[0] and all(s == sigs[0] for s in sigs), [d.py_func.__name__ for d in group]
    assert ringmm.compile_twins() == 0          # nothing left to add


def test_a_large_malicious_job_after_the_warm_up_compiles_nothing(warm):
    cfg = RingConfig()
    rng = np.random.default_rng(1)
    names = ("mult", "relu", "matmul", "trunc")  # products, comparisons, the matmul kernels
    big = 2 * ringmm.NOGIL_MIN_WORK             # past the GIL-free forms' threshold
    dealt = [catalog.KERNELS[n].deal(catalog.KERNELS[n].plaintext(rng, big, (128, 512, 512),
                                                                  cfg), cfg, rng)
             for n in names]

    def job(p, *shares):
        p.checks = Checks(p)
        for name, args in zip(names, shares):
            catalog.KERNELS[name].run(p, *args)
        p.checks.flush(p)

    before = warmup.compiled_forms()
    run_parties(job, [tuple(d[r] for d in dealt) for r in range(3)], parties=make_parties(cfg))
    compiled = sorted(d.py_func.__name__ for d, n in warmup.compiled_forms().items()
                      if n != before.get(d, 0))
    assert not compiled, compiled           # without compile_twins: _mm_parallel, ...nogil


def test_the_warm_up_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="semi-honest or malicious"):
        warmup.warm_up("paranoid")
