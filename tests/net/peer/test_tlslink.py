"""Peer links over TLS sockets (net/peer/tlslink.py): who may link, what ends a link, and that the
parties recover from it. (Results, traffic, chunking and job isolation over these links are
in tests/net/peer/test_net_link.py, which runs every case over both peer transports.)"""
import socket
import ssl
import struct
import time

import numpy as np
import pytest

from mpc3 import ring
from mpc3.comm import Aborted, PeerTimeout
from mpc3.kernels import arith
from mpc3.sharing import deal, reveal
from mpc3.sim import run_parties
from net import keys
from net.peer import mesh as local
from net.peer.handshake import Handshake
from net.proto import mpc3_pb2 as pb
from net.peer.router import PeerRouter
from net.peer.tlslink import SocketLink, SocketTransport
from net.peer.tlssock import tls_contexts

_ids = iter(range(10**6))


@pytest.fixture
def mesh(tls_mesh):
    return tls_mesh


def _mult_works(routers) -> bool:
    jid = f"j{next(_ids)}"
    parties = [r.open_job(jid, timeout=10) for r in routers]
    x, y = np.linspace(-2, 2, 12), np.linspace(3, -1, 12)
    sx, sy = deal(ring.encode(x)), deal(ring.encode(y))
    out = run_parties(lambda p, a, b: arith.mul_aa(p, a, b),
                      [(sx[i], sy[i]) for i in range(3)], parties=parties)
    return np.abs(ring.decode(reveal(out)) - x * y).max() < 1e-4


def _connect(certs, stem: str, router, name: str = "party-0", trust=None):
    """A TLS client with ``stem``'s certificate from ``certs``, trusting the CA in ``trust``
    (default ``certs``), at ``router``'s peer listener."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_cert_chain(certs / f"{stem}.pem", certs / f"{stem}.key")
    ctx.load_verify_locations((trust or certs) / "ca.pem")
    raw = socket.create_connection(("127.0.0.1", router.transport.port), timeout=5)
    return ctx.wrap_socket(raw, server_hostname=name)


def _refused(sock) -> bool:
    """The listener closed the connection without a word."""
    try:
        return sock.recv(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True
    finally:
        sock.close()


@pytest.mark.parametrize("stem", ["party-1", "user", "owner"])
def test_only_the_previous_party_may_link(mesh, certs, stem):
    """Party 0 takes its incoming link only from party 2: a valid certificate of the cluster
    CA with another role (party 1, a query user, the model owner) is refused after the
    handshake, and the real links keep working."""
    assert _refused(_connect(certs, stem, mesh[0]))
    assert mesh[0].links_up() == [1, 2]
    assert _mult_works(mesh)


def test_a_certificate_of_another_ca_is_refused(mesh, certs, tmp_path):
    """A client that trusts party 0 but presents a party-2 certificate of another CA is
    refused by party 0's handshake."""
    keys.generate(tmp_path)
    assert _refused(_connect(tmp_path, "party-2", mesh[0], trust=certs))
    assert mesh[0].links_up() == [1, 2] and _paired(mesh, 0, 2)
    assert _mult_works(mesh)


@pytest.mark.parametrize("stem, error", [("party-2", ssl.SSLCertVerificationError),
                                         ("fake-1", PermissionError)])
def test_dialler_checks_the_listeners_identity(certs, stem, error):
    """Party 0 links only to a listener proving it is party 1: party 2's certificate fails
    the name check, and a certificate carrying the name party-1 without party 1's role
    (party 2's role, misissued by the same CA) fails the role check."""
    import threading
    if stem == "fake-1":
        keys.issue(certs, stem, "impostor", "party-2", hosts=("party-1",))
    ls = socket.create_server(("127.0.0.1", 0))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs / f"{stem}.pem", certs / f"{stem}.key")

    def serve():
        srv, _ = ls.accept()
        try:
            _refused(ctx.wrap_socket(srv, server_side=True))
        except (OSError, ssl.SSLError):
            pass
    threading.Thread(target=serve, daemon=True).start()
    addr = "127.0.0.1:%d" % ls.getsockname()[1]
    t = SocketTransport("127.0.0.1:0", addr, tls_contexts(
        certs / "party-0.pem", certs / "party-0.key", certs / "ca.pem"), connect_timeout=5)
    t.router = PeerRouter(0, t)
    with pytest.raises(error):
        t._open(socket.create_connection(ls.getsockname(), timeout=5), 1, dialling=True)
    t.stop()
    ls.close()


def _as_party_2(certs, router) -> SocketLink:
    """An authenticated party-2 link into party 0, through the hello."""
    link = SocketLink(0, _connect(certs, "party-2", router), send_timeout=5)
    hs = Handshake()
    link.put(pb.PeerFrame(hello=hs.hello(2)))
    assert link.read_frame().hello.rank == 0
    return link


def _msg(n_id=1, layout=b"<u8:4", n_arrays=1, size=32, job=b"j"):
    return struct.pack("<BHIIQQ", 1, n_id, len(layout), n_arrays, 1, size) + job + layout


@pytest.fixture
def lone(certs):
    """Party 0's router and peer listener alone: no real party 2 to take its link back."""
    t = SocketTransport("127.0.0.1:0", "127.0.0.1:1", tls_contexts(
        certs / "party-0.pem", certs / "party-0.key", certs / "ca.pem"), connect_timeout=2)
    router = PeerRouter(0, t)
    router.start()
    yield router
    router.stop()


@pytest.mark.parametrize("garbage, why", [
    (struct.pack("<BI", 0, 1 << 31), "announced a frame of 2147483648 bytes"),
    (struct.pack("<BI", 0, 5) + b"\xff" * 5, "malformed frame"),
    (b"\x07", "unknown kind 7"),
    (_msg(n_id=5000), "header out of bounds"),
    (_msg(size=1 << 40), "header out of bounds"),
    (_msg(size=8), "accounts for 32"),
    (_msg(layout=b"<f8:4"), "unexpected dtype"),
    (_msg(job=b"\xff"), "malformed job id")])
def test_a_bad_frame_ends_the_link(lone, certs, caplog, garbage, why):
    """An authenticated peer sending a frame or message header out of bounds (refused before
    anything that size is allocated) or malformed loses its link, for the reason named."""
    link = _as_party_2(certs, lone)
    _wait(lambda: lone.links_up() == [2])
    with caplog.at_level("WARNING", logger="mpc3.link"):
        link.sock.sendall(garbage)
        assert _refused(link.sock)
        _wait(lambda: lone.links_up() == [])
        # the router logs the reason just after it drops the link: wait for the line too
        _wait(lambda: _downs(caplog))
    assert any(why in m for m in _downs(caplog)), [r.message for r in caplog.records]


def _downs(caplog) -> list[str]:
    return [r.message for r in caplog.records if "link to party 2 down" in r.message]


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_a_rogue_link_does_not_stick(mesh, certs):
    """A party-2 certificate holder that takes party 0's link and then sends garbage loses
    it; the real party 2 dials again and jobs run."""
    link = _as_party_2(certs, mesh[0])
    link.sock.sendall(b"\x07")
    assert _refused(link.sock)
    _wait(lambda: _paired(mesh, 0, 2) and all(r.wait_ready(0.1) for r in mesh))
    assert _mult_works(mesh)


def _paired(routers, a: int, b: int) -> bool:
    """a's and b's links to each other are the two ends of one connection (same seed)."""
    la, lb = routers[a]._links.get(b), routers[b]._links.get(a)
    return la is not None and lb is not None and la.seed == lb.seed


def test_a_vanished_peer_aborts_the_jobs_at_once(mesh):
    jid = f"j{next(_ids)}"
    parties = [r.open_job(jid, timeout=30) for r in mesh]
    mesh[2].stop()
    t0 = time.monotonic()
    with pytest.raises(Aborted, match="party 2"):
        parties[0].comm.exchange(from_prev=True)
    with pytest.raises(Aborted, match="party 2"):
        parties[1].comm.exchange(from_next=True)
    assert time.monotonic() - t0 < 3.0


def test_a_writer_gives_up_on_a_peer_that_stops_reading():
    a, b = socket.socketpair()
    a.setblocking(False)
    link = SocketLink(1, a, send_timeout=1.0)
    frame = pb.PeerFrame(job_id="j", op=1, data=b"x" * (1 << 20))
    t0 = time.monotonic()
    with pytest.raises(PeerTimeout, match="party 1 read too slowly"):
        for _ in range(64):                 # far more than the socket buffers hold
            link.put(frame)
    assert time.monotonic() - t0 < 5 and link.closed.is_set()
    with pytest.raises(Aborted):
        link.put(frame)
    b.close()


def test_development_plaintext_links():
    routers, stop = local.local_mesh(None, transport="tls")
    try:
        assert _mult_works(routers)
    finally:
        stop()


@pytest.mark.parametrize("grow", [None, 4096])
def test_messages_round_trip_in_raw_form(monkeypatch, grow):
    """Every dtype and shape a message can hold - empty, 0-d, non-contiguous, large enough
    to go out array by array, and (grow=4096) larger than the receive buffer's growth step -
    arrives equal, and an empty message arrives empty."""
    import threading
    from net.peer import tlslink
    if grow:
        monkeypatch.setattr(tlslink, "FIRST_BYTES", grow)
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    tx, rx = SocketLink(1, a, send_timeout=5), SocketLink(0, b, send_timeout=5)
    big = np.arange(200_000, dtype=np.uint64)
    msgs = [[np.arange(10, dtype=np.uint64), np.zeros((0, 3), np.uint64),
             np.array(5, dtype=np.int16), np.arange(12, dtype=np.uint8).reshape(3, 4)],
            [big[::2], big[:7].reshape(7, 1), np.ones(3, np.int64)],
            []]
    t = threading.Thread(target=lambda: [tx.send_message(f"job{k}", k + 1, m)
                                         for k, m in enumerate(msgs)])
    t.start()
    for k, sent in enumerate(msgs):
        job, op, got = rx.read_frame()
        assert (job, op, len(got)) == (f"job{k}", k + 1, len(sent))
        for x, y in zip(sent, got):
            assert x.dtype == y.dtype and x.shape == y.shape and (x == y).all()
    t.join()
    a.close()
    b.close()


def test_connections_stuck_before_their_handshake_are_capped_per_address(lone, certs):
    """Callers that connect and say nothing hold at most MAX_HANDSHAKES_PER_HOST handshake
    slots of one address (until the connect timeout); the next is closed at once, and once
    they are gone the real peer still links."""
    from net.peer.tlslink import MAX_HANDSHAKES_PER_HOST
    addr = ("127.0.0.1", lone.transport.port)
    idle = [socket.create_connection(addr, timeout=5) for _ in range(MAX_HANDSHAKES_PER_HOST)]
    # accepted, in their handshake (waited for, not slept on: a fixed sleep loses the race
    # to a busy accept thread, and the extra connection would then be admitted)
    _wait(lambda: lone.transport._pending.get("127.0.0.1", 0) == MAX_HANDSHAKES_PER_HOST)
    extra = socket.create_connection(addr, timeout=5)
    t0 = time.monotonic()
    assert _refused(extra) and time.monotonic() - t0 < 1.0
    for s in idle:
        s.settimeout(0.2)
        with pytest.raises(socket.timeout):     # still held open, waiting for a ClientHello
            s.recv(1)
        s.close()
    _wait(lambda: not lone.transport._pending)
    link = _as_party_2(certs, lone)
    _wait(lambda: lone.links_up() == [2])
    link.sock.close()


def test_a_sender_refuses_what_its_peer_would_refuse():
    """A message its receiver would refuse (floats, an overlong job id) fails in the sending
    job with ProtocolError and writes nothing, so it cannot end the link for other jobs."""
    from mpc3.comm import ProtocolError
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    tx = SocketLink(1, a, send_timeout=1)
    for job, arrays in (("j", [np.zeros(3)]), ("j" * 2000, [np.zeros(3, np.uint64)])):
        with pytest.raises(ProtocolError):
            tx.send_message(job, 1, arrays)
    with pytest.raises(BlockingIOError):
        b.recv(1)
    a.close()
    b.close()


def test_a_dial_that_reaches_itself_is_dropped():
    """A socket bound to port P dialling P on loopback connects to itself (TCP simultaneous
    open); the dial loop must see that and let go of the port its party is about to bind."""
    from net.peer.tlslink import _self_connected
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.connect(s.getsockname())
        assert _self_connected(s)
    ls = socket.create_server(("127.0.0.1", 0))
    with ls, socket.create_connection(ls.getsockname()) as c:
        assert not _self_connected(c)


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range():
    """Cluster ports come from outside the kernel's source-port range (where no outgoing
    connection can take them before the party binds), distinct, never handed out twice."""
    from app.localcluster import _ephemeral_range, free_ports
    lo, hi = _ephemeral_range()
    a, b = free_ports(6), free_ports(6)
    assert len(set(a + b)) == 12
    assert all(not lo <= p <= hi for p in a + b)
    for p in a:
        with socket.create_server(("127.0.0.1", p)):
            pass
