"""Parties built for the zero-knowledge tests of the proofs (tests/mpc3/test_dzkp*.py)."""
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
