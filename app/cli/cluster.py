"""Running a cluster: certificates, party processes, a local cluster, status.

    mpc3 keys --dir D                         CA + party and client certificates
    mpc3 keys --dir D --org O --party N       one organisation's CA and its party's cert
    mpc3 keys --ca-dir D --client NAME:ROLE   one more client of an existing CA
    mpc3 keys --ca-dir D --party N --host H   a new certificate for party N (rotation)
    mpc3 party --config C --id N              run party N (foreground)
    mpc3 cluster up --dir D [--new-ports]     three local parties; prints the config path
    mpc3 cluster down --dir D                 stop them
    mpc3 status --config C                    links, models and jobs of every party
"""
from __future__ import annotations

from pathlib import Path

from net import keys

from ..localcluster import START_WAIT_S, LocalCluster, exit_with_parent
from .common import add_client_creds, add_insecure, any_client, load


def register(sub) -> None:
    p = sub.add_parser("keys", help="create a CA and certificates for three parties and "
                       "clients, or add a client to an existing CA")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--dir", help="output directory for a new CA (must not hold one yet)")
    where.add_argument("--ca-dir", help="an existing CA's directory (ca.pem + ca.key): issue "
                       "the --client certificates (new clients) or --party N's (rotation), "
                       "change nothing else")
    p.add_argument("--host", action="append", default=None,
                   help="host name or IP the parties are reached at (repeatable; "
                        "default localhost and 127.0.0.1)")
    p.add_argument("--client", action="append", default=None, metavar="NAME:ROLE[:ORG]",
                   help="client certificate to issue, ROLE in model-owner|query-user, ORG "
                   "its organisation (the certificate's O; default --org: cluster-wide "
                   "limits are shared out per organisation) "
                        "(repeatable; default with --dir: owner:model-owner user:query-user "
                        "user2:query-user)")
    p.add_argument("--party", action="append", type=int, choices=(0, 1, 2), default=None,
                   help="with --dir: issue only this party's certificate (repeatable; default "
                   "all three) - one CA per organisation, each for the parties it runs; "
                   "with --ca-dir: a new certificate for this party (rotation)")
    p.add_argument("--org", default=None, help="with --dir: the organisation whose CA this "
                   "is (its name, CN 'mpc3 CA of ORG'; concatenate the organisations' ca.pem "
                   "files into the bundle every [cluster] ca names)")
    p.set_defaults(func=_cmd_keys)

    p = sub.add_parser("party", help="run one MPC party process (model inference job kinds)")
    p.add_argument("--config", required=True, help="the cluster TOML (deploy/cluster.toml)")
    p.add_argument("--id", type=int, required=True, choices=(0, 1, 2),
                   help="which party of the config this process is")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING")
    p.add_argument("--exit-with-parent", type=int, metavar="PID", default=None,
                   help="stop when process PID exits (set by benchmark and demo launchers)")
    p.add_argument("--metrics", metavar="HOST:PORT", default=None,
                   help="serve Prometheus metrics on http://HOST:PORT/metrics (overrides "
                   "metrics_listen of the party's [[party]] table; no TLS or "
                   "authentication: bind it to localhost or firewall it)")
    p.add_argument("--log-json", action="store_true",
                   help="log JSON lines (time, level, party, event, job, user) instead of "
                   "text (or log_format = \"json\" in the party's [[party]] table)")
    add_insecure(p)
    p.set_defaults(func=_cmd_party)

    p = sub.add_parser("cluster", help="start/stop three local parties")
    csub = p.add_subparsers(dest="action", required=True)
    up = csub.add_parser("up", help="generate certs + config, start three parties (or the "
                         "ones that stopped), wait until they are linked")
    up.add_argument("--dir", required=True, help="the cluster's directory (certificates, "
                    "cluster.toml, party logs and data)")
    up.add_argument("--host", default="127.0.0.1", help="address the parties listen on "
                    "(default 127.0.0.1)")
    up.add_argument("--base-port", type=int, default=0,
                    help="first of three ports (default: those of an earlier run in DIR, "
                         "else free ephemeral ports)")
    up.add_argument("--new-ports", action="store_true",
                    help="pick fresh ports even if DIR holds a config from an earlier run")
    up.add_argument("--peer-timeout", type=float, default=30.0,
                    help="seconds a party waits for a peer's message before failing the job")
    up.add_argument("--security", choices=("semi-honest", "malicious"), default="semi-honest",
                    help="[cluster] security written to DIR/cluster.toml (default semi-honest; "
                    "malicious: every job verified or refused, docs/MALICIOUS.md)")
    up.add_argument("--wait", type=float, default=START_WAIT_S,
                    help=f"seconds to wait for the parties to link up (default "
                    f"{START_WAIT_S:.0f}: the first start compiles their kernels)")
    add_insecure(up)
    up.set_defaults(func=_cmd_up)
    down = csub.add_parser("down", help="stop the parties started by 'cluster up'")
    down.add_argument("--dir", required=True, help="the directory of 'cluster up'")
    down.set_defaults(func=_cmd_down)

    p = sub.add_parser("status", help="health, links, models and jobs of every party; "
                       "exits 1 if a party is down or the parties disagree")
    add_client_creds(p)
    p.set_defaults(func=_cmd_status)


def _client_specs(specs, org: str | None = None) -> list[tuple[str, str, str | None]]:
    """(name, role, organisation) of each NAME:ROLE[:ORG] (``org``: the default ORG)."""
    clients = []
    for spec in specs:
        name, role, *rest = spec.split(":") + [""]
        if not name or "/" in name or role not in keys.CLIENT_ROLES or len(rest) > 2:
            raise ValueError(f"--client {spec!r}: expected NAME:model-owner or "
                             "NAME:query-user, optionally :ORGANISATION")
        clients.append((name, role, rest[0] or org))
    return clients


def _cmd_keys(args) -> int:
    if args.ca_dir is not None:
        if not (args.client or args.party) or args.org or (args.host and not args.party):
            raise ValueError("--ca-dir issues more certificates with an existing CA: give "
                             "--client NAME:ROLE (a new client) and/or --party N --host H "
                             "(a party's new certificate; the old one is kept as .old)")
        ca = Path(args.ca_dir) / "ca.pem"
        for name, role, org in _client_specs(args.client or ()):
            cert, key = keys.add_client(args.ca_dir, name, role, org)
            print(f"{role} {name}: {cert}, {key} (signed by {ca})")
        for n in sorted(set(args.party or ())):
            if not args.host:
                raise ValueError(f"--party {n}: give the --host names it is reached at")
            cert, key = keys.reissue_party(args.ca_dir, n, tuple(args.host))
            print(f"party {n}: {cert}, {key} (signed by {ca}; the old ones renamed .old)")
        return 0
    clients = _client_specs([f"{n}:{r}" for n, r in keys.DEFAULT_CLIENTS]
                            if args.client is None else args.client, args.org)
    parties = tuple(sorted(set(args.party))) if args.party else (0, 1, 2)
    d = keys.generate(args.dir, hosts=tuple(args.host or ("localhost", "127.0.0.1")),
                      clients=clients, parties=parties,
                      ca_name=f"mpc3 CA of {args.org}" if args.org else "mpc3 cluster CA")
    print(f"certificates written to {d}")
    return 0


def _cmd_party(args) -> int:
    import dataclasses

    from net.party import logjson
    cfg = load(args)
    pcfg = cfg.party(args.id)
    if args.metrics is not None or args.log_json:
        pcfg = dataclasses.replace(pcfg, metrics_listen=args.metrics or pcfg.metrics_listen,
                                   log_format="json" if args.log_json else pcfg.log_format)
        parties = tuple(pcfg if n == args.id else p for n, p in enumerate(cfg.parties))
        cfg = dataclasses.replace(cfg, parties=parties)
    logjson.configure(args.id, args.log_level, pcfg.log_format)
    from net.party.server import serve
    exit_with_parent(args.exit_with_parent)
    return serve(cfg, args.id)


def _cmd_up(args) -> int:
    cluster = LocalCluster(args.dir, insecure=args.insecure, host=args.host,
                           base_port=args.base_port, new_ports=args.new_ports,
                           peer_timeout=args.peer_timeout, security=args.security)
    cluster.start(wait=args.wait)
    print(cluster.path)
    return 0


def _cmd_down(args) -> int:
    d = Path(args.dir).resolve()
    if not any((d / f"party-{n}.pid").exists() for n in range(3)):
        raise RuntimeError(f"no cluster pid files in {d}")
    stopped = LocalCluster(d).stop()
    print(f"stopped parties {stopped}" if stopped else "no party was running")
    return 0


def _cmd_status(args) -> int:
    from net.client.failures import ClusterError
    from net.proto import mpc3_pb2 as pb
    cfg = load(args)
    replies = {}
    with any_client(args, cfg, rpc_timeout=5.0) as cl:
        for n in range(3):
            addr = cfg.dial_address(None, n)
            try:
                st = cl._call(n, "Status", pb.Empty(), 5.0)
            except ClusterError as exc:
                print(f"party {n} {addr}: DOWN ({exc})")
                continue
            replies[n] = st
            links = sorted(st.links_up)
            ok = len(links) == 2
            print(f"party {n} {addr}: {'OK' if ok else 'DEGRADED'} links={links} "
                  f"models={st.models} jobs_running={st.jobs_running} "
                  f"jobs_queued={st.jobs_queued} {'mTLS' if st.tls else 'PLAINTEXT'} "
                  f"security={st.security or 'semi-honest'}"
                  + (" DIAGNOSTIC-JOBS" if st.diagnostic else ""))
    problems = [f"party {n} is down" for n in range(3) if n not in replies]
    problems += [f"party {n} has links to {sorted(st.links_up)} only"
                 for n, st in replies.items() if len(st.links_up) != 2]
    for what, get in (("versions", lambda s: s.version), ("model counts", lambda s: s.models),
                      ("job kinds", lambda s: tuple(s.job_kinds)),
                      ("TLS settings", lambda s: s.tls),
                      ("security modes", lambda s: s.security or "semi-honest")):
        if len({get(s) for s in replies.values()}) > 1:
            problems.append("the parties disagree on " + what + ": " + ", ".join(
                f"party {n}: {get(s)}" for n, s in replies.items()))
    problems += [st.security_problem for st in replies.values() if st.security_problem]
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0
