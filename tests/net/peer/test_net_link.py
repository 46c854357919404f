"""The peer router over real loopback sockets (mTLS) - TLS socket links (the default) and gRPC
streams - behaves exactly like the in-process communicator."""
import threading
import time

import numpy as np
import pytest

from mpc3 import ring
from mpc3.comm import Aborted, PeerTimeout, ProtocolError
from mpc3.kernels import arith
from mpc3.sharing import deal, reveal
from mpc3.sim import make_parties, run_parties
from net import keys
from net.peer import mesh as local

ULP = 2.0 ** -ring.DEFAULT_FRAC


@pytest.fixture(scope="module", params=["tls", "grpc"])
def mesh(certs, request):
    routers, stop = local.local_mesh(certs, transport=request.param)
    yield routers
    stop()


_ids = iter(range(10**6))


def grpc_parties(routers, timeout=20.0):
    jid = f"t{next(_ids)}"
    return [r.open_job(jid, timeout=timeout) for r in routers]


def _kernel_case(parties, rng):
    x, y = rng.normal(size=(6, 40)), rng.normal(size=(6, 40))
    a, b = rng.normal(size=(2, 9, 33)), rng.normal(size=(33, 5))
    shares = [deal(ring.encode(v)) for v in (x, y, a, b)]

    def fn(p, sx, sy, sa, sb):
        return arith.mul_aa(p, sx, sy), arith.matmul_aa(p, sa, sb)

    out = run_parties(fn, [tuple(s[i] for s in shares) for i in range(3)], parties=parties)
    mul = ring.decode(reveal([o[0] for o in out]))
    mm = ring.decode(reveal([o[1] for o in out]))
    assert np.abs(mul - x * y).max() < 4 * ULP
    assert np.abs(mm - a @ b).max() < 40 * ULP
    return [(p.stats.bytes_sent, p.stats.messages, p.stats.rounds) for p in parties]


def test_same_results_and_traffic_as_inproc(mesh):
    over_grpc = _kernel_case(grpc_parties(mesh), np.random.default_rng(5))
    in_proc = _kernel_case(make_parties(), np.random.default_rng(5))
    assert over_grpc == in_proc


def test_large_messages_are_chunked(mesh):
    big = np.arange(3 * (1 << 17) + 5, dtype=np.uint64)       # > 3 MiB
    parties = grpc_parties(mesh)

    def fn(p):
        got, _ = p.comm.exchange(to_prev=[big + np.uint64(p.rank), big[:0], big[:3]],
                                 from_next=True)
        return got

    out = run_parties(fn, parties=parties)
    for r, got in enumerate(out):
        assert (got[0] == big + np.uint64((r + 1) % 3)).all()
        assert got[1].size == 0 and (got[2] == big[:3]).all()


def test_concurrent_jobs_never_mix(mesh):
    results, errors = {}, []

    def job(k):
        try:
            parties = grpc_parties(mesh)
            x = np.random.default_rng(k).normal(size=(8, 16))
            w = np.random.default_rng(100 + k).normal(size=(16, 16)) * 0.3
            sx, sw = deal(ring.encode(x)), deal(ring.encode(w))

            def fn(p, a, b):
                for _ in range(5):
                    a = arith.matmul_aa(p, a, b)
                return a

            out = run_parties(fn, [(sx[i], sw[i]) for i in range(3)], parties=parties)
            ref = x
            for _ in range(5):
                ref = ref @ w
            results[k] = np.abs(ring.decode(reveal(out)) - ref).max()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=job, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 6 and max(results.values()) < 1e-3


def test_missing_message_times_out(mesh):
    parties = grpc_parties(mesh, timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(PeerTimeout):
        parties[0].comm.exchange(from_next=True)
    assert time.monotonic() - t0 < 2.0


def test_op_counter_mismatch_raises(mesh):
    parties = grpc_parties(mesh, timeout=5)
    parties[1].comm.op = 41
    parties[1].comm.exchange(to_prev=[np.zeros(3, np.uint64)])
    with pytest.raises(ProtocolError, match="expected message 1"):
        parties[0].comm.exchange(from_next=True)


def test_abort_reaches_the_other_parties(mesh):
    parties = grpc_parties(mesh, timeout=10)
    t0 = time.monotonic()
    parties[2].comm.abort("party 2 failed: boom")
    for p in parties[:2]:
        with pytest.raises(Aborted, match="boom"):
            p.comm.exchange(from_next=True, from_prev=True)
    assert time.monotonic() - t0 < 2.0


def test_job_ids_are_single_use_and_seeds_differ(mesh):
    parties = grpc_parties(mesh)
    with pytest.raises(ValueError, match="already used"):
        mesh[0].open_job(parties[0].comm.job_id)
    # pairwise keys agree between neighbours and nothing else
    for r in range(3):
        assert parties[r].prg.next == parties[(r + 1) % 3].prg.prev
        assert parties[r].prg.next != parties[r].prg.prev
    assert len({p.prg.private for p in parties}) == 3


def test_party_with_wrong_certificate_cannot_link(tmp_path, mesh):
    """A peer whose cert says another party (or a client) is refused by the listener."""
    import grpc
    if mesh[0].transport is not None:
        pytest.skip("gRPC streams only: tests/net/peer/test_tlslink.py covers the socket links")
    from net.proto import mpc3_pb2 as pb, mpc3_pb2_grpc as pb_grpc
    keys.generate(tmp_path)
    rogue = keys.channel_credentials(tmp_path / "user.pem", tmp_path / "user.key",
                                     tmp_path / "ca.pem")
    # the mesh's CA differs from tmp_path's: handshake itself fails
    addr = mesh[0].transport.dial
    ch = grpc.secure_channel(addr, rogue, options=[("grpc.ssl_target_name_override", "party-1")])
    with pytest.raises(grpc.RpcError) as err:
        next(pb_grpc.PeerServiceStub(ch).Link(iter([pb.PeerFrame()]), timeout=5))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    ch.close()


def test_bytes_held_for_unopened_jobs_are_bounded(mesh, monkeypatch):
    """Messages for a job this party has not opened yet are held (the peer may start first)
    up to MAX_UNOPENED_BYTES over all such jobs; past it the job is aborted, its bytes are
    dropped and opening it fails naming why. Within the bound they are delivered."""
    from net.peer import router
    monkeypatch.setattr(router, "MAX_UNOPENED_BYTES", 3000)
    r0, r1 = mesh[0], mesh[1]
    ok, over = f"held{next(_ids)}", f"over{next(_ids)}"
    p_ok, p_over = r1.open_job(ok, timeout=5), r1.open_job(over, timeout=5)
    p_ok.comm.exchange(to_prev=[np.arange(100, dtype=np.uint64)])            # 800 bytes
    for _ in range(4):
        p_over.comm.exchange(to_prev=[np.zeros(100, dtype=np.uint64)])      # 3200 in all

    def held_for(jid):
        return r0._boxes.get(jid)

    deadline = time.monotonic() + 5
    while not (held_for(over) and held_for(over).aborted) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "has not opened" in held_for(over).aborted
    assert r0._held == 800 and held_for(ok).held == 800
    got = r0.open_job(ok, timeout=5).comm.exchange(from_next=True)[0]
    assert (got[0] == np.arange(100, dtype=np.uint64)).all() and r0._held == 0
    with pytest.raises(Aborted, match="has not opened"):
        r0.open_job(over, timeout=5).comm.exchange(from_next=True)
