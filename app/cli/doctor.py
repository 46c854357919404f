"""``mpc3 doctor``: check a running cluster and run one tiny secure job through it.

    mpc3 doctor --config C [--no-job] [--max-skew S]

Prints one line per party (version, kernels, links, clock, limits) and the test job's
cost and error (:mod:`app.doctor`); exits 1 with the first problem as its last line
(``mpc3 doctor: <reason>``) and every other one above it.
"""
from __future__ import annotations

import sys

from .common import add_insecure, load


def _cmd_doctor(args) -> int:
    from ..doctor import diagnose
    cfg = load(args)
    report = diagnose(cfg, job=not args.no_job, max_skew=args.max_skew,
                      owner_creds=(args.owner_cert, args.owner_key),
                      user_creds=(args.user_cert, args.user_key))
    for line in report.lines:
        print(line)
    if report.ok():
        print("doctor: OK - every party is up, linked and ready"
              + ("" if args.no_job else ", and a secure job ran correctly"))
        return 0
    for p in report.problems[1:]:
        print(f"PROBLEM: {p}")
    print(f"mpc3 doctor: {report.problems[0]}", file=sys.stderr)
    return 1


def register(sub) -> None:
    from ..doctor import MAX_SKEW_S
    p = sub.add_parser("doctor", help="check every party (version, kernels, links, clock, "
                       "limits) and run a tiny secure job through all three; exits 1 with "
                       "the reason")
    p.add_argument("--config", required=True, help="cluster TOML")
    p.add_argument("--no-job", action="store_true", help="only the parties' status")
    p.add_argument("--max-skew", type=float, default=MAX_SKEW_S, metavar="S",
                   help=f"clock difference to tolerate, seconds (default {MAX_SKEW_S:g})")
    for role in ("owner", "user"):
        p.add_argument(f"--{role}-cert", help=f"{role} certificate for the test job "
                       f"(default: [clients.{'model-owner' if role == 'owner' else 'query-user'}])")
        p.add_argument(f"--{role}-key")
    add_insecure(p)
    p.set_defaults(func=_cmd_doctor)
