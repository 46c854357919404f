"""Parties built for the tests of the proofs (tests/mpc3/test_dzkp*.py): with chosen keys
(zero knowledge), or one of them deviating in one round of a proof."""
import numpy as np

from mpc3.party import Party
from mpc3.prg import PRG
from mpc3.sim import InProcComm, _Net


def parties_with_private(seed: bytes, private: bytes) -> list[Party]:
    """Three parties whose pairwise keys come from ``seed`` and private keys from
    ``private`` (so two runs share every challenge and differ in the prover's pads)."""
    net = _Net()
    pair = [seed + b"pair%d" % i for i in range(3)]
    return [Party(rank=r, comm=InProcComm(rank=r, net=net),
                  prg=PRG.for_job(pair[(r - 1) % 3], pair[r], private + b"%d" % r, "job"))
            for r in range(3)]


def deviating(p: Party, job, args: tuple, rank: int, call: int, direction: str, change,
              received: dict):
    """``job(p, *args)`` where party ``rank`` replaces what it sends ``direction``
    ("to_next", "to_prev") in its ``call``-th round by ``change(arrays)``; every party
    records the uint64 arrays it receives from next in ``received[rank]`` (a verifier's
    openings). Returns the job's result or the exception it raised (after aborting)."""
    real, count = p.comm.exchange, [0]

    def spy(*a, **kw):
        count[0] += 1
        if p.rank == rank and count[0] == call:
            kw[direction] = change(kw[direction])
        got = real(*a, **kw)
        if got[0] is not None:
            received[p.rank] += [x for x in got[0] if x.dtype == np.uint64]
        return got
    p.comm.exchange = spy
    try:
        return job(p, *args)
    except BaseException as exc:  # noqa: BLE001 - the outcome of the trial
        p.comm.abort(f"party {p.rank}: {exc}")
        return exc
