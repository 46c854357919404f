"""The malicious job runner (net.party.malicious) through the runner's real path, three
parties in one process (net.party.inproc): a job made only of verified operations (a plain
matrix product, an opening) passes its flushes and returns the semi-honest result; one
deviating message aborts the job at every party, naming the job and the party, with no
output kept; a job with an unverified operation is refused; and the parties then serve the
next job. The job kind is this test's own registry's: the product has no such kind. The
deviation is attached through the runner's ``open_party`` seam (mpc3.tamper)."""
import numpy as np
import pytest

from mpc3 import tamper
from mpc3.kernels import arith, convert
from mpc3.sharing import deal, reveal
from mpc3.shares import AShare
from net.errors import BadRequest, Code
from net.party.inproc import InprocParties
from net.party import malicious
from net.party.malicious import FLUSH_AT, MAX_FLUSHES, FlushingCosts
from net.peer.linkbase import Link
from net.peer.handshake import Handshake
from net.peer.router import PeerRouter
from net.proto import mpc3_pb2 as pb
from protocols.jobs import TENSORS, JobRegistry, JobSpec, ModelView, TensorSpec

S = pb.JobStatusReply
M64 = 1 << 64


def _covered(ctx, inputs):
    """X @ W without truncation (one layer, marked), then an opening of the product to the
    parties; with ``unverified``, also a bare reshare of a 3-out-of-3 value (which nothing
    can verify: malicious mode refuses it)."""
    p = ctx.party
    with tamper.scope(p, "matmul"):
        y = arith.matmul_aa(p, inputs["X"], ctx.model.shares["W"], trunc=False)
    if ctx.params.get("unverified", False):
        arith.reshare(p, y.a.copy())
    ctx.costs.mark("layer.0")
    with tamper.scope(p, "open"):
        arith.open_a(p, y)
    return {"Y": y}


def _packed(ctx, inputs):
    """ReLU of X: its comparison's bit planes travel packed, with padding (6 bits a group)."""
    with tamper.scope(ctx.party, "relu"):
        y = convert.relu_a(ctx.party, inputs["X"])
    ctx.costs.mark("layer.0")
    return {"Y": y}


REGISTRY = JobRegistry([JobSpec("covered", _covered, (TensorSpec("X", ("M", "K")),),
                                (TensorSpec("Y", ("M", "N")),), (TENSORS,), "covered",
                                "test only", params=("unverified",), diagnostic=True),
                        JobSpec("packed", _packed, (TensorSpec("X", ("M", "K")),),
                                (TensorSpec("Y", ("M", "K")),), (TENSORS,), "packed",
                                "test only", diagnostic=True)])


def _cluster(security: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.integers(0, M64, size=(6, 4), dtype=np.uint64)
    ws = deal(w, rng)
    models = [ModelView("m", {"W": ws[r]}, {"kind": TENSORS}) for r in range(3)]
    return InprocParties(models, registry=REGISTRY, timeout=20.0, security=security), w


def _run(ip, x, params=None, seed=1, kind="covered"):
    xs = deal(x, np.random.default_rng(seed))
    try:
        jobs = ip.run(kind, params or {}, [{"X": xs[r]} for r in range(3)])
        return jobs, None
    except RuntimeError as exc:
        jobs = [list(ip.runners[r].jobs.values())[-1] for r in range(3)]
        return jobs, exc


def _x(seed=2):
    return np.random.default_rng(seed).integers(0, M64, size=(3, 6), dtype=np.uint64)


def _wrap(ip, rank, target=None, deviation=None) -> list:
    """Party ``rank``'s next job runs behind the tamper harness, attached through the
    runner's ``open_party`` seam (deviating if ``target`` says so); its TamperComm is
    appended to the returned list."""
    runner, comms = ip.runners[rank], []
    plain = runner.open_party

    def open_party(job_id):
        party = plain(job_id)
        comms.append(tamper.attach(party, target, deviation))
        runner.open_party = plain                    # this job only
        return party
    runner.open_party = open_party
    return comms


def test_a_covered_job_passes_its_flushes_and_gives_the_semi_honest_result():
    x = _x()
    mal, w = _cluster("malicious")
    semi, _ = _cluster("semi-honest")
    jobs, err = _run(mal, x)
    assert err is None
    y = reveal([j.outputs["Y"] for j in jobs])
    assert np.array_equal(y, x @ w)                     # modulo 2^64, untruncated
    sjobs, err = _run(semi, x)
    assert err is None and np.array_equal(reveal([j.outputs["Y"] for j in sjobs]), y)
    for j, s in zip(jobs, sjobs):      # the flush costs rounds; a small layer's waits for
        assert [c["layer"] for c in j.costs] == ["layer.0"]         # the job's end
        assert j.party.stats.rounds > s.party.stats.rounds
        assert j.costs[0]["rounds"] == s.costs[0]["rounds"]


@pytest.mark.parametrize("where,kind", [("matmul", "add"), ("matmul", "flip"),
                                        ("open", "add")])
def test_one_deviating_message_aborts_the_job_at_every_party_naming_job_and_party(where, kind):
    x = _x(3)
    ip, w = _cluster("malicious", seed=4)
    honest, err = _run(ip, x)
    assert err is None
    # the direction party 1 sends in, in that scope (recorded on an untampered run)
    comms = _wrap(ip, 1)
    assert _run(ip, x)[1] is None
    direction = next(s.direction for s in comms[0].sent if s.kernel == where)
    target = tamper.Target(1, direction, kernel=where, k=0)
    cheat = _wrap(ip, 1, target, tamper.Deviation(kind, error=1 << 63, seed=5))
    jobs, err = _run(ip, x)
    assert err is not None and len(cheat[0].records) == 1
    assert len({j.job_id for j in jobs}) == 1
    for j in jobs:
        assert j.state == S.FAILED, (j.state, j.error)
        assert j.job_id in j.error and "suspect party 1" in j.error, j.error
        assert j.outputs is None                         # nothing to fetch
    again, err = _run(ip, x)                             # the parties keep serving
    assert err is None and np.array_equal(reveal([j.outputs["Y"] for j in again]), x @ w)


def test_an_unverified_operation_is_refused_at_every_party_then_the_next_job_runs():
    x = _x(6)
    ip, w = _cluster("malicious", seed=7)
    jobs, err = _run(ip, x, {"unverified": True})
    assert err is not None
    for j in jobs:
        assert j.state == S.FAILED and j.outputs is None
        assert j.error.startswith(f"party {j.party.rank}: job {j.job_id} refused: malicious "
                                  "mode:") and "no verification yet" in j.error, j.error
    again, err = _run(ip, x)
    assert err is None and np.array_equal(reveal([j.outputs["Y"] for j in again]), x @ w)


@pytest.mark.parametrize("what", ["weights", "input"])
def test_an_inconsistent_sharing_aborts_at_every_party(what):
    """Party 1's copy of slot 2 (party 2's ``a``) differs by one: as if the model owner or
    the query user dealt inconsistent shares, or party 1 altered its copy. A weight the job
    never uses is caught by the input digests alone; the input X also changes party 1's
    product, whose proof fails first."""
    x = _x(10)
    ip, w = _cluster("malicious", seed=11)
    xs = deal(x, np.random.default_rng(12))
    if what == "weights":
        vs = deal(np.arange(5, dtype=np.uint64), np.random.default_rng(13))
        for r, m in enumerate(ip.models):
            v = vs[r] if r != 1 else AShare(vs[1].a, vs[1].b + np.uint64(1))
            m.shares = {**m.shares, "V": v}
    else:
        bad = xs[1].b.copy()
        bad[2, 5] += np.uint64(1)
        xs[1] = AShare(xs[1].a, bad)
    with pytest.raises(RuntimeError):
        ip.run("covered", {}, [{"X": xs[r]} for r in range(3)])
    jobs = [list(ip.runners[r].jobs.values())[-1] for r in range(3)]
    for j in jobs:
        assert j.state == S.FAILED and j.outputs is None
        assert j.job_id in j.error and "suspect party 1" in j.error, j.error
        if what == "weights":
            assert "party 2's copy of an input slot differs from party 1's" in j.error, j.error


def test_weight_digests_are_computed_once_per_loaded_array():
    ip, w = _cluster("malicious", seed=13)
    assert _run(ip, _x(14))[1] is None
    W = [m.shares["W"] for m in ip.models]
    first = [malicious.slot_digest(s) for x in W for s in (x.a, x.b)]
    jobs, err = _run(ip, _x(15))
    assert err is None
    assert all(malicious.slot_digest(s) is d         # not hashed again by the job
               for s, d in zip([s for x in W for s in (x.a, x.b)], first))
    assert np.array_equal(reveal([j.outputs["Y"] for j in jobs]), _x(15) @ w)


def test_semi_honest_runs_the_unverified_operation():
    ip, _ = _cluster("semi-honest", seed=8)
    jobs, err = _run(ip, _x(9), {"unverified": True})
    assert err is None and all(j.party.checks is None for j in jobs)


class _Stub:
    """Checks as FlushingCosts sees them: a pending size, flushes counted."""

    def __init__(self, pending=FLUSH_AT):
        self.flushes, self.pending = 0, pending

    def flush(self, p):
        self.flushes += 1


def test_a_layer_end_flushes_only_large_pending_checks():
    """A decoding step's small layers are proven together at the job's end; a prompt's
    large ones one by one (their memory)."""
    ip, _ = _cluster("malicious")
    party = ip._opener(0)("sizes")
    party.checks = _Stub(pending=FLUSH_AT - 1)
    costs = FlushingCosts(party)
    costs.mark("layer.0")
    assert party.checks.flushes == 0
    party.checks.pending = FLUSH_AT
    costs.mark("layer.1")
    assert party.checks.flushes == 1


def test_flushes_per_job_are_bounded():
    Stub = _Stub

    ip, _ = _cluster("malicious")
    party = ip._opener(0)("bound")
    party.checks = Stub()
    costs = FlushingCosts(party)
    for i in range(3 * MAX_FLUSHES):
        costs.mark(f"layer.{i}")
    assert party.checks.flushes == MAX_FLUSHES - 1 and len(costs.entries) == 3 * MAX_FLUSHES
    costs.flush()                                        # the job's last one
    assert party.checks.flushes == MAX_FLUSHES


def test_modes_travel_in_the_hello_and_a_disagreement_refuses_jobs():
    a, b = Handshake(security="malicious"), Handshake()
    ha, hb = a.hello(0), b.hello(1)
    a.seed(ha, hb, 0, 1)
    b.seed(hb, ha, 0, 1)
    assert (a.peer_security, b.peer_security) == ("semi-honest", "malicious")
    router = PeerRouter(0, transport=None, security="malicious")
    link = Link(1)
    link.security = a.peer_security
    router.link_up(1, link)
    problem = router.security_problem()
    assert 'party 0 runs security = "malicious" but party 1 runs "semi-honest"' in problem
    ip, _ = _cluster("malicious")
    ip.runners[0].mode_problem = router.security_problem
    xs = deal(_x(), np.random.default_rng(0))
    with pytest.raises(BadRequest) as err:
        ip.runners[0].accept("covered", "j1", "u", ip.models[0], "inproc", {}, {"X": xs[0]})
    assert err.value.code == Code.FAILED_PRECONDITION and "every job is refused" in str(err.value)


def test_a_disagreement_seen_only_once_the_job_starts_fails_it_everywhere():
    """A peer's hello naming another mode that arrives between admission and start (its
    link came up in between): the job fails at the party that sees it before it sends
    anything, and its abort fails it at the others."""
    ip, w = _cluster("malicious", seed=16)
    seen = iter(["", "party 1 runs security = \"malicious\" but party 2 runs \"semi-honest\""])
    ip.runners[1].mode_problem = lambda: next(seen)
    jobs, err = _run(ip, _x(17))
    assert err is not None
    assert all(j.state == S.FAILED and j.outputs is None for j in jobs)
    assert 'ModeMismatch: party 1 runs security = "malicious"' in jobs[1].error, jobs[1].error
    assert jobs[1].party.comm.op == 0


@pytest.mark.parametrize("security", ["semi-honest", "malicious"])
def test_a_set_padding_bit_is_refused_by_its_receiver_and_aborts_every_party(security):
    """Bit 7 of the last byte of one of party 1's packed bit planes (a padding bit: 6 bits
    a group) set: the receiver refuses the message at once (MalformedMessage, either mode),
    naming party 1; the runner sends the abort, so the other two fail with that reason too
    rather than at the peer timeout; the parties then serve the next job."""
    x = _x(16) - np.uint64(1 << 63)                  # both signs
    ip, _ = _cluster(security, seed=17)
    comms = _wrap(ip, 1)
    honest, err = _run(ip, x, kind="packed")
    assert err is None
    sent = next(s for s in comms[0].sent if s.kernel == "relu" and s.dtypes[0] == "|u1")
    element = int(np.prod(sent.shapes[0])) - 1
    _wrap(ip, 1, tamper.Target(1, sent.direction, op=sent.op),
          tamper.Deviation("flip", element=element, bit=7))
    jobs, err = _run(ip, x, kind="packed")
    assert err is not None
    receiver = (1 + sent.direction) % 3
    for j in jobs:
        assert j.state == S.FAILED and j.outputs is None, (j.state, j.error)
        assert "suspect party 1" in j.error and "malformed message" in j.error, j.error
        assert "non-zero padding bits" in j.error, j.error
    assert jobs[receiver].error.startswith(f"party {receiver}: job {jobs[receiver].job_id} "
                                           "aborted, suspect party 1: party")
    again, err = _run(ip, x, kind="packed")
    assert err is None
    assert np.array_equal(reveal([j.outputs["Y"] for j in again]),
                          reveal([j.outputs["Y"] for j in honest]))


def test_a_seed_mismatch_names_both_verifiers_and_is_sent_to_the_peers():
    """The prover cannot tell which of its verifiers sent the other challenge seed
    (mpc3.dzkp_rounds.challenge_seeds): the job's error names both, and the runner sends
    it to the peers (only the prover raises it)."""
    from mpc3.comm import SeedMismatch
    exc = SeedMismatch(0)
    msg = malicious.refusal(0, "job-7", exc)
    assert "job-7" in msg and "suspect parties 1 or 2" in msg and "nothing was revealed" in msg
    assert not malicious.raised_everywhere(exc)
