"""Malicious mode over the whole kernel catalog: every kernel either is verified - the
flush accepts it, its value is the semi-honest one within the kernel's bound, and a changed
message in it aborts - or is refused at the flush with Unverified; nothing runs unchecked
and nothing else happens. VERIFIED is the coverage docs/MALICIOUS.md states."""
import numpy as np
import pytest

from mpc3 import dzkp, tamper
from mpc3.ring import decode as ring_decode, encode as ring_encode
from mpc3.checks import Checks, Unverified
from mpc3.comm import MalformedMessage
from mpc3.kernels import catalog
from mpc3.party import RingConfig
from mpc3.sim import make_parties, run_parties

#: every kernel but the resharing of a 3-out-of-3 input, which no other party's values
#: determine (it is verified inside the kernels that produce such an input, never alone)
VERIFIED = set(catalog.KERNELS) - catalog.UNVERIFIED
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


def _last_bytes(sent):
    """(message, flat index of the last entry) of every byte array of the messages: where a
    packed message's padding is, if it has any."""
    for s in sent:
        end = 0
        for shape, dtype in zip(s.shapes, s.dtypes):
            end += int(np.prod(shape))
            if np.dtype(dtype) == np.uint8 and np.prod(shape):
                yield s, end - 1


@pytest.mark.parametrize("name", sorted(VERIFIED))
def test_the_top_bit_of_every_packed_messages_last_byte_is_checked(name):
    """Bit 7 of the last byte of every byte-packed array the kernel sends, flipped: a
    padding bit where the packing leaves one (refused on receipt: MalformedMessage naming
    the sender, as honest senders zero padding), else a data bit (the proof rejects it).
    Either way the job aborts with the cheater among the rejected; before, a flipped
    padding bit went unnoticed."""
    kernel, cfg, plain, shares = _case(name)
    seen = {}
    clean = tamper.run(_job(kernel, seen), shares, make_parties(cfg))
    hits = [(s, e) for s, e in _last_bytes(clean.sent) if s.op <= seen[s.party]]
    if not hits:
        pytest.skip(f"{name} sends no byte-packed message")
    for s, element in hits[::max(1, len(hits) // 4)]:          # at most about 4 a kernel
        got = tamper.run(_job(kernel), shares, make_parties(cfg),
                         tamper.Target(s.party, s.direction, op=s.op),
                         tamper.Deviation("flip", element=element, bit=7))
        assert isinstance(got.error, dzkp.CheatingDetected), (s, element, got.error)
        assert s.party in got.error.rejected, (s, got.error)
        if isinstance(got.error, MalformedMessage):
            assert got.error.prover == s.party


def test_padding_is_refused_in_semi_honest_mode_too():
    """The refusal is in the unpacking, not the proof: a semi-honest cluster refuses a set
    padding bit too (drelu's messages at N=64 in three groups all have padding), naming
    the sender, where it used to ignore it."""
    kernel, cfg, plain, shares = _case("drelu")
    job = lambda p, *sh: kernel.run(p, *sh)      # noqa: E731 - no Checks: semi-honest
    clean = tamper.run(job, shares, make_parties(cfg))
    hits = list(_last_bytes(clean.sent))
    assert hits
    for s, element in hits[:3]:
        got = tamper.run(job, shares, make_parties(cfg),
                         tamper.Target(s.party, s.direction, op=s.op),
                         tamper.Deviation("flip", element=element, bit=7))
        assert isinstance(got.error, MalformedMessage), (s, got.error)
        assert got.error.prover == s.party and "padding" in str(got.error)
        assert f"received from party {s.party}" in str(got.error)


@pytest.mark.parametrize("kernel", ["gelu", "silu"])
def test_malicious_mode_takes_the_chebyshev_form_of_gelu_and_silu(kernel):
    """In malicious mode "auto" is the Chebyshev form also on few elements (a decode step's
    FFN row): its two comparisons, not the segments' five, so fewer pending checks; the
    Chebyshev form's rounds, the error claim kept, and the flush passes."""
    from mpc3.kernels import activations, silu
    from mpc3.kernels.piecewise import form
    from mpc3.sharing import deal, reveal
    fn, ref, err, cost = {
        "gelu": (activations.gelu_a, activations.gelu_ref, activations.GELU_ERROR,
                 activations.cost_gelu),
        "silu": (silu.silu_a, silu.silu_ref, silu.SILU_ERROR, silu.cost_silu)}[kernel]
    cfg = RingConfig()
    x = np.linspace(-6, 6, 96)
    xs = deal(ring_encode(x, cfg.frac), np.random.default_rng(0))
    assert form(kernel, "auto", x.size) == "segments" and form(kernel, "auto", x.size, True) \
        == "cheb"

    def job(p, xv, method):
        p.checks = Checks(p)
        before = p.stats.snapshot()
        out = fn(p, xv, method)
        spent, pending = p.stats - before, p.checks.pending
        p.checks.flush(p)
        return out, spent.rounds, pending

    auto = run_parties(job, [(xs[i], "auto") for i in range(3)], parties=make_parties())
    seg = run_parties(job, [(xs[i], "segments") for i in range(3)], parties=make_parties())
    got = ring_decode(reveal([r[0] for r in auto]), cfg.frac)
    assert np.max(np.abs(got - ref(x))) <= err[cfg.trunc]
    assert auto[0][1] == cost(x.size, cfg, "cheb").rounds
    assert auto[0][2] < seg[0][2]
