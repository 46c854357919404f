"""Certificates for a cluster: one CA, three parties, and clients whose role is in the cert.

Roles live in the subject's OrganizationalUnit: ``party-0`` .. ``party-2``, ``model-owner``,
``query-user``. The CommonName is the identity (a query user may fetch only outputs of jobs
submitted under its own CN). The Organization (O) is who the identity belongs to: a party's
cluster-wide limits are shared out per organisation (net.limits). ``mpc3`` - the O every
certificate issued without ``org`` carries - names no organisation: such an identity counts
as its own. Party certificates carry the DNS name ``party-N`` (clients and
peers dial with that name as the TLS target, so the handshake proves which party answered)
plus any host names / IP addresses the party is reached at.

Private keys are written with mode 0600; the CA key stays in the directory it was created in
and is needed only to issue more certificates (keep it offline in production).
"""
from __future__ import annotations

import datetime as _dt
import functools
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PARTY_ROLES = ("party-0", "party-1", "party-2")
CLIENT_ROLES = ("model-owner", "query-user")
ROLES = PARTY_ROLES + CLIENT_ROLES
DEFAULT_CLIENTS = (("owner", "model-owner"), ("user", "query-user"), ("user2", "query-user"))
VALID_DAYS = 365
NO_ORG = "mpc3"     # the O of certificates issued without an organisation


@dataclass(frozen=True)
class Identity:
    """Who is calling, as proven by the TLS client certificate."""

    name: str      # CN
    role: str      # OU
    org: str = ""  # O, "" when absent or NO_ORG (the identity is its own organisation)

    @property
    def party_rank(self) -> int | None:
        return PARTY_ROLES.index(self.role) if self.role in PARTY_ROLES else None


def identity_from_pem(pem: bytes) -> Identity:
    cert = x509.load_pem_x509_certificate(pem)
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    ou = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    if not cn or not ou:
        raise ValueError("certificate lacks CN or OU")
    o = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    org = str(o[0].value) if o else ""
    return Identity(str(cn[0].value), str(ou[0].value), "" if org == NO_ORG else org)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(cn: str, ou: str, org: str = NO_ORG) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                      x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _san(hosts) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def create_ca(directory: Path, name: str = "mpc3 cluster CA") -> None:
    """``ca.pem``/``ca.key`` in ``directory``; ``name`` is the CA's CN (one CA per
    organisation: a CN of its own, so a trust bundle of several CAs tells them apart)."""
    key = _key()
    now = _dt.datetime.now(_dt.timezone.utc)
    name = _name(name, "ca")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + _dt.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .sign(key, hashes.SHA256()))
    _write_key(directory / "ca.key", key)
    _write_cert(directory / "ca.pem", cert)


def issue(directory: Path, stem: str, cn: str, role: str, hosts=(),
          org: str | None = None) -> tuple[Path, Path]:
    """Issue ``<stem>.pem``/``<stem>.key`` signed by the CA in ``directory``; ``org``: the
    organisation the identity belongs to (its certificate's O; none by default)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    key = _key()
    now = _dt.datetime.now(_dt.timezone.utc)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (x509.CertificateBuilder().subject_name(_name(cn, role, org or NO_ORG))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - _dt.timedelta(minutes=5))
               .not_valid_after(now + _dt.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
    if role in PARTY_ROLES:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = builder.add_extension(
            x509.SubjectAlternativeName(_san([role, *hosts])), critical=False)
    cert = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False).sign(
        ca_key, hashes.SHA256())
    _write_key(directory / f"{stem}.key", key)
    _write_cert(directory / f"{stem}.pem", cert)
    return directory / f"{stem}.pem", directory / f"{stem}.key"


def generate(directory, hosts=("localhost", "127.0.0.1"), party_hosts=None,
             clients=DEFAULT_CLIENTS, parties=(0, 1, 2), ca_name: str = "mpc3 cluster CA"
             ) -> Path:
    """A CA + the certificates of ``parties`` + client certificates in ``directory``.

    ``party_hosts``: optional per-party host lists (else every party gets ``hosts``).
    One CA per organisation: each runs this with its own ``parties`` (e.g. ``(1,)``) and
    ``ca_name``, and every party and client trusts the concatenation of the ``ca.pem``s.
    Refuses to overwrite an existing CA.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if (d / "ca.key").exists():
        raise FileExistsError(f"{d / 'ca.key'} exists; refusing to overwrite a CA")
    create_ca(d, ca_name)
    for n in parties:
        issue(d, f"party-{n}", f"party-{n}", PARTY_ROLES[n],
              hosts=(party_hosts[n] if party_hosts else hosts))
    for stem, role, *org in clients:              # (name, role[, organisation])
        issue(d, stem, stem, role, org=org[0] if org else None)
    return d


def add_client(directory, name: str, role: str, org: str | None = None) -> tuple[Path, Path]:
    """Issue one more client certificate ``<name>.pem``/``.key`` (organisation ``org``) with
    the CA in ``directory``, changing nothing else; refuses to overwrite an existing one."""
    d = Path(directory)
    if role not in CLIENT_ROLES:
        raise ValueError(f"role {role!r}: expected model-owner or query-user")
    if not (d / "ca.key").exists():
        raise FileNotFoundError(f"{d / 'ca.key'} not found: --ca-dir must hold the CA "
                                "(ca.pem and ca.key) that signs the new certificate")
    for ext in ("pem", "key"):
        if (d / f"{name}.{ext}").exists():
            raise FileExistsError(f"{d / f'{name}.{ext}'} exists; choose another name or "
                                  "move the old certificate away to replace it")
    return issue(d, name, name, role, org=org)


def reissue_party(directory, n: int, hosts) -> tuple[Path, Path]:
    """A new ``party-N.pem``/``.key`` signed by the CA in ``directory`` (rotation); the old
    pair, if any, is renamed ``party-N.pem.old``/``.key.old``."""
    d = Path(directory)
    if not (d / "ca.key").exists():
        raise FileNotFoundError(f"{d / 'ca.key'} not found: --ca-dir must hold the CA "
                                "(ca.pem and ca.key) that signs the new certificate")
    for ext in ("pem", "key"):
        if (d / f"party-{n}.{ext}").exists():
            os.replace(d / f"party-{n}.{ext}", d / f"party-{n}.{ext}.old")
    return issue(d, f"party-{n}", f"party-{n}", PARTY_ROLES[n], hosts=hosts)


def read_pem(path, what: str, where: str) -> bytes:
    """The bytes of a certificate or key file, or one line naming the file, ``what`` it is
    and ``where`` its path was set (the config key, or the option)."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} not found (set by {where}): copy the file "
                                "there or change that setting") from None
    except PermissionError:
        raise PermissionError(f"{what} {path} (set by {where}) is not readable by uid "
                              f"{os.getuid()}: fix its owner or mode") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"{what} {path} (set by {where}) is a directory, not a "
                                "PEM file") from None


def why_not_trusted(cert: Path, ca: Path) -> str:
    """Why a party could refuse ``cert`` given the cluster's ``ca`` (one CA or a bundle of
    several, one per organisation), as far as a client can tell locally: another issuer, a
    bad signature, expiry, or a role a party does not take."""
    c = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    bundle = x509.load_pem_x509_certificates(Path(ca).read_bytes())
    authority = next((a for a in bundle if a.subject == c.issuer), None)
    if authority is None:
        return (f"it was issued by '{c.issuer.rfc4514_string()}', not by the cluster's CA "
                + " or ".join(f"'{a.subject.rfc4514_string()}'" for a in bundle))
    try:
        c.verify_directly_issued_by(authority)
    except (ValueError, TypeError, Exception):  # noqa: BLE001 - InvalidSignature and kin
        return "its signature does not verify against the cluster's CA"
    now = _dt.datetime.now(_dt.timezone.utc)
    if now > c.not_valid_after_utc:
        return f"it expired on {c.not_valid_after_utc:%Y-%m-%d}"
    if now < c.not_valid_before_utc:
        return f"it is valid only from {c.not_valid_before_utc:%Y-%m-%d}"
    return "the party did not say why (the certificate looks valid for this CA)"


# ------------------------------------------------------------------- gRPC credentials ----
@functools.lru_cache(maxsize=256)
def _identity_cached(pem: bytes) -> Identity:
    return identity_from_pem(pem)


def peer_identity(context) -> Identity | None:
    """Identity of the caller from its verified TLS client certificate (None if plaintext)."""
    pems = context.auth_context().get("x509_pem_cert")
    if not pems:
        return None
    return _identity_cached(bytes(pems[0]))


PARTY_SOURCES = ("[cluster] ca", "[[party]] cert", "[[party]] key")


def server_credentials(cert: Path, key: Path, ca: Path):
    """mTLS server credentials: clients must present a certificate signed by the CA."""
    import grpc
    return grpc.ssl_server_credentials(
        [(read_pem(key, "party key", PARTY_SOURCES[2]),
          read_pem(cert, "party certificate", PARTY_SOURCES[1]))],
        root_certificates=read_pem(ca, "CA file", PARTY_SOURCES[0]), require_client_auth=True)


def cred_sources(role: str, config_path, cert, key) -> tuple[str, str, str]:
    """Where a client's CA, cert and key paths come from: ``--cert``/``--key`` when given
    (``cert``/``key`` not None), else the config's ``[clients.ROLE]`` table."""
    return ("[cluster] ca", *(f"--{k}" if v else f"[clients.{role}] {k} in {config_path}"
                              for k, v in (("cert", cert), ("key", key))))


def channel_credentials(cert: Path | None, key: Path | None, ca: Path,
                        where: tuple[str, str, str] | None = None):
    """mTLS channel credentials; ``where``: the settings a client's CA, cert and key paths
    came from (:func:`cred_sources`), named when a file is missing (default: a party's)."""
    import grpc
    who = "party" if where is None else "client"
    where = where or PARTY_SOURCES
    return grpc.ssl_channel_credentials(
        read_pem(ca, "CA file", where[0]),
        read_pem(key, f"{who} key", where[2]) if key else None,
        read_pem(cert, f"{who} certificate", where[1]) if cert else None)


def party_target_name(rank: int) -> str:
    """TLS name every party certificate carries; dialled names are checked against it."""
    return PARTY_ROLES[rank]
