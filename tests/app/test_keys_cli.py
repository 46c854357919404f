"""Key management from the command line (issue 32): a client added to an existing CA
(``mpc3 keys --ca-dir D --client NAME:ROLE``) and one CA per organisation (``mpc3 keys --dir
D --org O --party N``, the trust bundle being the concatenation of the CA files), checked by
real TLS handshakes; a missing client cert/key file is one line naming it and its setting."""
import shutil
import socket
import ssl
import threading

import numpy as np
import pytest

from app import cli
from mpc3 import ring
from mpc3.kernels import arith
from mpc3.sharing import deal, reveal
from mpc3.sim import run_parties
from net import keys
from net.peer import mesh
from net.peer.tlssock import tls_contexts


def _keys(*argv) -> int:
    return cli.main(["keys", *map(str, argv)])


def _handshake(server_cert, server_key, ca, client_cert, client_key) -> str | None:
    """None if a party's listener (its TLS context) accepts this client, else why not."""
    srv_ctx, _ = tls_contexts(server_cert, server_key, ca)
    cli_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cli_ctx.load_verify_locations(ca)
    cli_ctx.load_cert_chain(client_cert, client_key)
    cli_ctx.check_hostname = False
    a, b = socket.socketpair()
    a.settimeout(5), b.settimeout(5)
    errors = []

    def serve():
        try:
            with srv_ctx.wrap_socket(a, server_side=True) as s:
                s.recv(1)
        except (ssl.SSLError, OSError) as exc:
            errors.append(exc)
    t = threading.Thread(target=serve)
    t.start()
    try:
        with cli_ctx.wrap_socket(b) as c:
            c.sendall(b"x")
    except (ssl.SSLError, OSError) as exc:
        errors.append(exc)
    t.join()
    return str(errors[0]) if errors else None


def test_a_client_added_to_an_existing_ca_changes_nothing_else(tmp_path, capsys):
    d = tmp_path / "certs"
    assert _keys("--dir", d, "--client", "owner:model-owner") == 0
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    assert _keys("--ca-dir", d, "--client", "bob:query-user") == 0
    assert "query-user bob:" in capsys.readouterr().out
    after = {p.name: p.read_bytes() for p in d.iterdir()}
    assert set(after) - set(before) == {"bob.pem", "bob.key"}
    assert all(after[n] == v for n, v in before.items())          # nothing regenerated
    assert keys.identity_from_pem(after["bob.pem"]) == keys.Identity("bob", "query-user")
    assert (d / "bob.key").stat().st_mode & 0o777 == 0o600
    assert _handshake(d / "party-1.pem", d / "party-1.key", d / "ca.pem",
                      d / "bob.pem", d / "bob.key") is None
    # the same name twice, a wrong role, no CA: one line each, nothing written
    assert _keys("--ca-dir", d, "--client", "bob:query-user") == 2
    assert "bob.pem exists" in capsys.readouterr().err
    assert _keys("--ca-dir", d, "--client", "eve:party-0") == 2
    assert _keys("--ca-dir", tmp_path / "nope", "--client", "eve:query-user") == 2
    err = capsys.readouterr().err
    assert "ca.key not found" in err and "eve" not in {p.stem for p in d.iterdir()}
    assert _keys("--ca-dir", d, "--client", "x:query-user", "--party", "1") == 2


def _org_bundle(tmp_path):
    """Three organisations, each its own CA and party; a directory as a party host sees it:
    every party's cert/key and ``ca.pem`` = the concatenation of the three CAs."""
    orgs = []
    for n, org in enumerate(("alpha", "beta", "gamma")):
        d = tmp_path / org
        assert _keys("--dir", d, "--org", org, "--party", n, "--host", "127.0.0.1",
                     "--client", f"{org}-user:query-user") == 0
        assert sorted(p.name for p in d.iterdir()) == sorted(
            ["ca.pem", "ca.key", f"party-{n}.pem", f"party-{n}.key", f"{org}-user.pem",
             f"{org}-user.key"])
        orgs.append(d)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for n, d in enumerate(orgs):
        for ext in ("pem", "key"):
            shutil.copy(d / f"party-{n}.{ext}", bundle / f"party-{n}.{ext}")
    (bundle / "ca.pem").write_bytes(b"".join((d / "ca.pem").read_bytes() for d in orgs))
    return orgs, bundle


def _mult_works(routers) -> bool:
    parties = [r.open_job("org-ca", timeout=10) for r in routers]
    x, y = np.linspace(-2, 2, 12), np.linspace(3, -1, 12)
    sx, sy = deal(ring.encode(x)), deal(ring.encode(y))
    out = run_parties(lambda p, a, b: arith.mul_aa(p, a, b),
                      [(sx[i], sy[i]) for i in range(3)], parties=parties)
    return np.abs(ring.decode(reveal(out)) - x * y).max() < 1e-4


@pytest.mark.parametrize("transport", ["tls", "grpc"])
def test_parties_of_three_organisations_trust_a_bundle_of_their_cas(tmp_path, transport):
    """Party links (TLS sockets, or gRPC: the client API's credentials) come up between
    parties whose certificates three different CAs signed, when every party trusts the
    bundle of the three; and a secure product runs over them."""
    orgs, bundle = _org_bundle(tmp_path)
    subjects = {x.subject.rfc4514_string() for x in keys.x509.load_pem_x509_certificates(
        (bundle / "ca.pem").read_bytes())}
    assert len(subjects) == 3 and "CN=mpc3 CA of beta,OU=ca,O=mpc3" in subjects
    routers, stop = mesh.local_mesh(bundle, transport=transport)
    try:
        assert _mult_works(routers)
    finally:
        stop()
    # org gamma's query user is accepted by org alpha's party
    assert _handshake(bundle / "party-0.pem", bundle / "party-0.key", bundle / "ca.pem",
                      orgs[2] / "gamma-user.pem", orgs[2] / "gamma-user.key") is None


def test_a_party_refuses_an_organisation_missing_from_its_bundle(tmp_path):
    orgs, bundle = _org_bundle(tmp_path)
    partial = tmp_path / "partial.pem"
    partial.write_bytes((orgs[0] / "ca.pem").read_bytes() + (orgs[2] / "ca.pem").read_bytes())
    why = _handshake(bundle / "party-0.pem", bundle / "party-0.key", partial,
                     bundle / "party-1.pem", bundle / "party-1.key")
    assert why is not None
    reason = keys.why_not_trusted(bundle / "party-1.pem", partial)
    assert reason.startswith("it was issued by 'CN=mpc3 CA of beta") and \
        "'CN=mpc3 CA of alpha,OU=ca,O=mpc3' or 'CN=mpc3 CA of gamma" in reason


def test_a_missing_client_key_is_one_line_naming_the_file_and_its_setting(tmp_path):
    from net.client.user import QueryUser
    from net.config import load
    d = tmp_path / "certs"
    keys.generate(d, clients=[("alice", "query-user")])
    cfg_path = tmp_path / "cluster.toml"
    parties = "".join(f'[[party]]\nid = {n}\naddress = "127.0.0.1:{7700 + n}"\n'
                      f'cert = "certs/party-{n}.pem"\nkey = "certs/party-{n}.key"\n\n'
                      for n in range(3))
    cfg_path.write_text(f'[cluster]\nca = "certs/ca.pem"\n\n{parties}'
                        '[clients.query-user]\ncert = "certs/alice.pem"\n'
                        'key = "certs/user.key"\n')
    with pytest.raises(FileNotFoundError) as exc:
        QueryUser(load(cfg_path))
    msg = str(exc.value)
    assert msg == (f"client key {d / 'user.key'} not found (set by [clients.query-user] key "
                   f"in {cfg_path}): copy the file there or change that setting")
    with pytest.raises(FileNotFoundError, match=r"^client certificate /nope.pem not found "
                       r"\(set by --cert\)"):
        QueryUser(load(cfg_path), "/nope.pem", d / "alice.key")


def test_a_party_certificate_is_rotated_with_the_same_ca(tmp_path):
    d = tmp_path / "certs"
    assert _keys("--dir", d, "--host", "127.0.0.1") == 0
    old = (d / "party-1.pem").read_bytes()
    ca = (d / "ca.pem").read_bytes()
    assert _keys("--ca-dir", d, "--party", "1", "--host", "mpc-b.example.org") == 0
    assert (d / "party-1.pem.old").read_bytes() == old and (d / "ca.pem").read_bytes() == ca
    new = keys.x509.load_pem_x509_certificate((d / "party-1.pem").read_bytes())
    names = new.extensions.get_extension_for_class(keys.x509.SubjectAlternativeName).value
    assert names.get_values_for_type(keys.x509.DNSName) == ["party-1", "mpc-b.example.org"]
    assert _handshake(d / "party-0.pem", d / "party-0.key", d / "ca.pem",
                      d / "party-1.pem", d / "party-1.key") is None
    assert _keys("--ca-dir", d, "--party", "2") == 2                 # no --host


def test_clients_carry_their_organisation(tmp_path):
    """NAME:ROLE:ORG puts ORG in the certificate's O, which the parties' cluster-wide limits
    are shared out by (net.limits org_*); --dir --org O makes O every client's default, and
    a client without an organisation counts as its own."""
    assert _keys("--dir", tmp_path / "acme", "--org", "acme", "--party", 0,
                 "--client", "alice:query-user", "--client", "bob:query-user:beta") == 0
    assert _keys("--ca-dir", tmp_path / "acme", "--client", "carol:model-owner:acme",
                 "--client", "dave:query-user") == 0
    org = {n: keys.identity_from_pem((tmp_path / "acme" / f"{n}.pem").read_bytes()).org
           for n in ("alice", "bob", "carol", "dave")}
    assert org == {"alice": "acme", "bob": "beta", "carol": "acme", "dave": ""}
    assert _keys("--ca-dir", tmp_path / "acme", "--client", "eve:query-user:a:b") == 2
