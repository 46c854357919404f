"""Who reads a socket link (net/peer/readturn.py): the job thread waiting for a message reads it
itself, the reader thread reads what nobody waits for, a blocked writer gets a reader, and a
bad frame read by a job thread ends the link as the reader's would."""
import socket
import threading
import time

import numpy as np
import pytest

from mpc3 import ring
from mpc3.comm import Aborted, PeerTimeout
from mpc3.kernels import arith
from mpc3.sharing import deal, reveal
from mpc3.sim import run_parties
from net import keys
from net.peer import readturn
from net.peer.router import PeerRouter
from net.peer.streams import StreamTransport
from net.peer.tlslink import _MSG, SocketLink
from net.peer.tlssock import tls_contexts

_ids = iter(range(10**6))


@pytest.fixture
def mesh(tls_mesh):
    return tls_mesh


def _links(routers):
    return [link for r in routers for link in r._links.values()]


def _park_readers(routers):
    """Keep every reader thread out of the way until a writer blocks (as if a job thread had
    just read each link, for an hour)."""
    for link in _links(routers):
        link._direct_at = time.monotonic() + 3600
        link._kick.set()
    time.sleep(2 * readturn.SLICE_S)        # readers in an idle poll see it after one slice


def _record_dispatch(monkeypatch):
    """Names of the threads that handed frames to a router."""
    names = []
    orig = readturn.ReadTurns._dispatch

    def spy(self, router, item):
        names.append(threading.current_thread().name)
        return orig(self, router, item)
    monkeypatch.setattr(readturn.ReadTurns, "_dispatch", spy)
    return names


def test_job_threads_read_their_own_messages(mesh, monkeypatch):
    """With the reader threads parked, a 30-round job runs: each party's job thread reads
    its messages from the links itself, and no other thread hands a frame on."""
    _park_readers(mesh)
    names = _record_dispatch(monkeypatch)
    jid = f"j{next(_ids)}"
    parties = [r.open_job(jid, timeout=10) for r in mesh]
    x, y = np.linspace(-1, 1, 16), np.linspace(2, -2, 16)
    sx, sy = deal(ring.encode(x)), deal(ring.encode(y))

    def fn(p, a, b):
        for _ in range(30):
            a = arith.mul_aa(p, a, b)
            a = arith.mul_aa(p, a, arith.public_share(p, ring.encode(1 / y)))
        return a

    out = run_parties(fn, [(sx[i], sy[i]) for i in range(3)], parties=parties)
    assert np.abs(ring.decode(reveal(out)) - x).max() < 1e-3
    assert len(names) == 3 * 2 * parties[0].stats.rounds       # every message, once
    assert set(names) == {f"mpc3-party{i}" for i in range(3)}     # run_parties' threads


def test_large_messages_both_ways_with_parked_readers(mesh):
    """Every party sends 24 MiB to both neighbours in the same round (more than the socket
    buffers hold, so every writer blocks while its peers write to it too): the blocked
    writers call the readers in, and the round completes."""
    _park_readers(mesh)
    big = np.arange(3 << 20, dtype=np.uint64)
    jid = f"j{next(_ids)}"
    parties = [r.open_job(jid, timeout=30) for r in mesh]

    def fn(p):
        return p.comm.exchange(to_next=[big + np.uint64(p.rank)], to_prev=[big * np.uint64(2)],
                               from_next=True, from_prev=True)

    t0 = time.monotonic()
    out = run_parties(fn, parties=parties)
    assert time.monotonic() - t0 < 20
    for r, (nxt, prv) in enumerate(out):
        assert (nxt[0] == big * np.uint64(2)).all()
        assert (prv[0] == big + np.uint64((r - 1) % 3)).all()


def test_the_reader_delivers_what_no_job_thread_waits_for(mesh):
    """A message for a job whose thread is busy elsewhere reaches its mailbox through the
    reader thread."""
    jid = f"j{next(_ids)}"
    parties = [r.open_job(jid, timeout=10) for r in mesh]
    parties[1].comm.exchange(to_prev=[np.arange(5, dtype=np.uint64)])
    box = mesh[0]._boxes[jid]
    deadline = time.monotonic() + 5
    while not box.msgs[1]:
        assert time.monotonic() < deadline, "the reader thread never delivered"
        time.sleep(0.01)
    got, _ = parties[0].comm.exchange(from_next=True)
    assert (got[0] == np.arange(5, dtype=np.uint64)).all()


def test_a_job_that_ends_calls_the_reader_back(mesh, monkeypatch):
    """However long the grace, the reader reads again as soon as a job ends: the next job's
    first frames (the leader's "start" of net.party.runner) do not wait for it."""
    monkeypatch.setattr(readturn, "GRACE_S", 3600.0)
    jid = f"j{next(_ids)}"
    parties = [r.open_job(jid, timeout=10) for r in mesh]
    run_parties(lambda p: p.comm.exchange(to_prev=[np.zeros(2, np.uint64)], from_next=True),
                parties=parties)            # the job threads read: the readers stand aside
    nxt = f"j{next(_ids)}"
    later = [r.open_job(nxt, timeout=10) for r in mesh]
    for r in mesh:
        r.close_job(jid)
    later[1].comm.exchange(to_prev=[np.arange(3, dtype=np.uint64)])
    box, deadline = mesh[0]._boxes[nxt], time.monotonic() + 5
    while not box.msgs[1]:
        assert time.monotonic() < deadline, "the reader waited out the grace"
        time.sleep(0.01)


def _pair_router():
    """A router of party 0 whose links to parties 1 and 2 are socket pairs (no reader
    threads), and the peers' ends of them as SocketLinks."""
    router = PeerRouter(0, StreamTransport("127.0.0.1:1", tls=False))   # never started
    peers = {}
    for peer in (1, 2):
        a, b = socket.socketpair()
        for s in (a, b):
            s.setblocking(False)
        link = SocketLink(peer, a, send_timeout=5.0)
        link.seed = bytes([peer]) * 32
        router._links[peer] = link
        peers[peer] = SocketLink(0, b, send_timeout=5.0)
    return router, peers


def test_a_follower_gets_its_message_from_the_thread_reading():
    """Two jobs wait on the same link: the one without the turn waits as a follower, gets
    its message handed on by the other, and the other still gets its own later."""
    router, peers = _pair_router()
    a, b = (router.open_job(f"f{next(_ids)}", timeout=10) for _ in range(2))
    got = {}

    def take(party, key):
        got[key] = router.take(party.comm.job_id, 1, 1, 10.0)

    ta = threading.Thread(target=take, args=(a, "a"))
    ta.start()
    time.sleep(0.1)                     # a holds the turn, polling
    tb = threading.Thread(target=take, args=(b, "b"))
    tb.start()
    time.sleep(0.1)
    peers[1].send_message(b.comm.job_id, 1, [np.full(3, 7, np.uint64)])
    tb.join(5)
    assert not tb.is_alive() and (got["b"][0] == 7).all() and "a" not in got
    peers[1].send_message(a.comm.job_id, 1, [np.full(2, 9, np.uint64)])
    ta.join(5)
    assert not ta.is_alive() and (got["a"][0] == 9).all()


def test_a_bad_frame_read_by_a_job_thread_ends_the_link():
    """Garbage read by a waiting job thread closes the link; the reader thread reports that
    reason and the router aborts the link's jobs."""
    router, peers = _pair_router()
    party = router.open_job(f"g{next(_ids)}", timeout=10)
    link = router._links[1]
    errors = []

    def take():
        try:
            router.take(party.comm.job_id, 1, 1, 10.0)
        except Aborted as exc:
            errors.append(str(exc))

    t = threading.Thread(target=take)
    t.start()
    time.sleep(0.1)
    peers[1].sock.sendall(b"\x07")
    deadline = time.monotonic() + 5
    while not link.closed.is_set():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    reason = link.serve(router)             # the reader thread's report, as _run_link logs it
    assert "unknown kind 7" in reason
    router.link_lost(1, link, reason)
    t.join(5)
    assert errors and "unknown kind 7" in errors[0]


def _taking(router, jid, timeout):
    """router.take of message 1 from party 1 in a thread; (thread, its outcome)."""
    out = {}

    def take():
        try:
            out["got"] = router.take(jid, 1, 1, timeout)
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            out["exc"] = exc
    t = threading.Thread(target=take, daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("stop", ["deadline", "abort"])
def test_a_peer_stalling_mid_frame_does_not_hold_the_job(stop):
    """A peer that stops halfway through a message (a paused process: keepalives still
    answered) holds no job thread past its deadline or its job's abort; the frame resumes
    in a later turn when the rest arrives."""
    router, peers = _pair_router()
    jid = f"s{next(_ids)}"
    router.open_job(jid, timeout=10)
    t, out = _taking(router, jid, 0.5 if stop == "deadline" else 30)
    time.sleep(0.1)
    arrays = [np.arange(6, dtype=np.uint64)]
    wire = []
    peers[1]._send = lambda parts: wire.extend(bytes(memoryview(x)) for x in parts)
    peers[1].send_message(jid, 1, arrays)
    data = b"".join(wire)
    peers[1].sock.sendall(data[:_MSG.size + 3])         # the header and 3 payload bytes
    time.sleep(0.1)
    if stop == "abort":
        router._boxes[jid].abort("job deadline exceeded")  # the runner's watchdog
    t.join(3)
    assert not t.is_alive()
    assert isinstance(out["exc"], PeerTimeout if stop == "deadline" else Aborted)
    if stop == "deadline":                  # the rest arrives: the next turn completes it
        peers[1].sock.sendall(data[_MSG.size + 3:])
        assert (router.take(jid, 1, 1, 5.0)[0] == arrays[0]).all()


def test_a_frame_sharing_a_tls_record_with_the_last_is_read(certs):
    """Bytes TLS has decrypted and holds are invisible to poll: a frame that shares a TLS
    record with the end of the previous payload is still read at once."""
    srv_ctx, _ = tls_contexts(certs / "party-0.pem", certs / "party-0.key", certs / "ca.pem")
    _, cli_ctx = tls_contexts(certs / "party-1.pem", certs / "party-1.key", certs / "ca.pem")
    a, b = socket.socketpair()
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("s", srv_ctx.wrap_socket(
        a, server_side=True)))
    t.start()
    cli = cli_ctx.wrap_socket(b, server_hostname=keys.party_target_name(0))
    t.join()
    router, _ = _pair_router()
    got["s"].setblocking(False)
    link = SocketLink(1, got["s"], send_timeout=5.0)
    link.seed = router._links[1].seed
    router._links[1] = link
    x, y = (router.open_job(f"r{next(_ids)}", timeout=10).comm.job_id for _ in range(2))
    wire = []
    enc = SocketLink(0, socket.socketpair()[0], 5.0)
    enc._send = lambda parts: wire.extend(bytes(memoryview(p)) for p in parts)
    enc.send_message(x, 1, [np.arange(3750, dtype=np.uint64)])      # 30000-byte payload
    enc.send_message(y, 1, [np.arange(4, dtype=np.uint64)])
    cli.sendall(b"".join(wire))             # one TLS write: y's frame ends x's last record
    assert (router.take(y, 1, 1, 2.0)[0] == np.arange(4)).all()
    assert (router.take(x, 1, 1, 2.0)[0] == np.arange(3750)).all()
