"""``mpc3 doctor``: is this cluster fit to serve? Each party's Status (version, kernels,
links, clock, limits) and then one tiny secure job through all three parties.

The job is an owner's and a user's real path, end to end: a random two-layer encoder
classifier (d_model 16) is calibrated and shared as model owner under a fresh id, one
``classify`` job runs as query user, its logits are compared with the float64 reference,
and the model is deleted. It needs the config's ``[clients.model-owner]`` and
``[clients.query-user]`` certificates (both exist in a ``cluster up`` directory);
``--no-job`` skips it.

Clock skew is the party's time in its Status reply minus the midpoint of the call, so the
round trip bounds the error. A party that cannot compile its kernels does not start
(:func:`net.party.server.prepare_kernels`); doctor reports it down - its log has the reason.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import numpy as np

from mpc3 import ring
from net.config import ClusterConfig

#: clock difference (seconds) beyond which a party is reported: certificates' validity and
#: the job deadlines assume roughly synchronized clocks
MAX_SKEW_S = 2.0
#: the test job's logits against the float64 reference (the bound of
#: tests/protocols/stacks/test_classifier.py)
JOB_TOLERANCE = 2e-3


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        return not self.problems


def _client(cfg: ClusterConfig, role: str, cert=None, key=None, **kw):
    from net.client.owner import ModelOwner
    from net.client.user import QueryUser
    cls = ModelOwner if role == "model-owner" else QueryUser
    return cls(cfg, cert, key, **kw)


def check_parties(cfg: ClusterConfig, cl, report: Report, max_skew: float = MAX_SKEW_S,
                  timeout: float = 5.0) -> dict:
    """Status of every party into ``report``; returns {rank: StatusReply} of those up."""
    from net.proto import mpc3_pb2 as pb

    def one(n: int):
        t0 = time.time()
        st = cl._call(n, "Status", pb.Empty(), timeout)
        t1 = time.time()
        return st, st.party_time - (t0 + t1) / 2, (t1 - t0) / 2

    up, down = {}, []
    for n, (got, err) in enumerate(cl._settled(one)):
        addr = cfg.dial_address(None, n)
        if err is not None:
            report.lines.append(f"party {n} {addr}: DOWN ({err})")
            down.append(f"party {n} ({addr}) is down or unreachable: {err}"
                        + _log_hint(cfg, n))
            continue
        st, skew, rtt = got
        up[n] = st
        limits = json.loads(st.limits_json or "{}")
        kernels = (f"kernels ready ({st.kernels_compiled} compiled forms, built or loaded in "
                   f"{st.kernels_compile_s:.1f} s)" if st.kernels_ready else
                   "kernels NOT prepared (compiled in the first jobs)")
        report.lines.append(
            f"party {n} {addr}: {st.version}, {kernels}, links {sorted(st.links_up)}, clock "
            f"{skew:+.3f} s (+-{rtt:.3f}), up {st.uptime_s:.0f} s, {st.models} models, "
            f"{st.jobs_running} running / {st.jobs_queued} queued, limits running_jobs="
            f"{limits.get('running_jobs')} user_jobs={limits.get('user_jobs')} "
            f"queued_jobs={limits.get('queued_jobs')}, {'mTLS' if st.tls else 'PLAINTEXT'}, "
            f"security {st.security or 'semi-honest'}"
            + (", DIAGNOSTIC JOB KINDS" if st.diagnostic else ""))
        if st.security_problem:
            report.problems.append(st.security_problem)
        if not st.kernels_ready:
            report.problems.append(f"party {n}: secure kernels not ready (an older party "
                                   "version, or a process that skipped prepare_kernels)")
        if len(st.links_up) != 2:
            missing = sorted({0, 1, 2} - {n} - set(st.links_up))
            report.problems.append(f"party {n}: no link to party {missing} (check its "
                                   "peer_address and firewall)")
        if abs(skew) - rtt > max_skew:
            report.problems.append(f"party {n}: clock differs from this host's by "
                                   f"{skew:+.1f} s (more than {max_skew:g} s): run NTP")
        if st.diagnostic:
            report.problems.append(f"party {n} is a benchmark/test process (diagnostic job "
                                   "kinds): never share real models with it")
    for what, get in (("versions", lambda s: s.version), ("limits", lambda s: s.limits_json),
                      ("job kinds", lambda s: tuple(s.job_kinds)),
                      ("TLS settings", lambda s: s.tls),
                      ("security modes", lambda s: s.security or "semi-honest")):
        if len({get(s) for s in up.values()}) > 1:
            report.problems.append(f"the parties disagree on {what}: " + ", ".join(
                f"party {n}: {get(s)}" for n, s in sorted(up.items())))
    report.problems[:0] = down                  # the cause first, its effects (links) after
    return up


def _log_hint(cfg: ClusterConfig, n: int) -> str:
    """The last line of a local cluster's ``party-N.log`` beside its config (``cluster
    up``: why a party exited, e.g. kernels that cannot compile), else where to look."""
    log = cfg.path.parent / f"party-{n}.log" if cfg.path is not None else None
    try:
        last = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1]
    except (AttributeError, OSError, IndexError):
        return "; see the party's log (journalctl -u mpc3-party)"
    return f"; {log.name} ends: {last.strip()[:300]}"


def tiny_model():
    """(config, weights, user tensors) of the test job's random encoder classifier."""
    from protocols import model as M
    cfg = M.ModelConfig(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32,
                        attn_c=0.125, attn_norm="mean", norm_first=True, max_len=8,
                        arch="encoder-classifier", n_enc_layers=2, src_vocab=20,
                        n_classes=3).validate()
    return cfg, M.random_weights(cfg, 11), M.random_user(cfg, 11)


def run_test_job(cfg: ClusterConfig, report: Report, owner_creds=(None, None),
                 user_creds=(None, None)) -> None:
    """Share the tiny model, classify one input, compare, delete: into ``report``."""
    from net.client.failures import ClusterError
    from protocols import model as M

    from .owner import share_transformer
    from .translate import Traffic
    mcfg, w, user = tiny_model()
    model_id = "doctor-" + os.urandom(6).hex()
    x = M.embed_tokens(mcfg, user, np.array([[1, 5, 7, 2, 9]]))
    t0 = time.monotonic()
    try:
        share_transformer(cfg, model_id, mcfg, w, None, *owner_creds, source="mpc3 doctor",
                          user=user)
    except (ClusterError, ValueError, RuntimeError) as exc:
        report.problems.append(f"the test model could not be shared: {exc}")
        return
    shared_s = time.monotonic() - t0
    try:
        with _client(cfg, "query-user", *user_creds, rpc_timeout=30.0) as qu:
            t0 = time.monotonic()
            job = qu.submit(model_id, "classify", {"X": x})
            st = qu.wait(job, timeout=cfg.peer_timeout_s + 60)
            got = {k: ring.decode(v, qu.frac) for k, v in qu.fetch(job).items()}
            took = time.monotonic() - t0
        cost = Traffic()
        cost.add_parties([(s.bytes_sent, s.messages, s.rounds) for s in st], took)
        err = float(np.abs(got["logits"].astype(np.float64) -
                           M.ref_classify(mcfg, w, x)).max())
        report.lines.append(
            f"test job: model shared and verified in {shared_s:.1f} s; classify on 3 parties "
            f"in {took:.2f} s, {cost.bytes_total} bytes, {cost.rounds} rounds; max error "
            f"{err:.1e} against the float64 reference")
        if not err <= JOB_TOLERANCE:
            report.problems.append(f"the test job's result is off by {err:.3g} (tolerance "
                                   f"{JOB_TOLERANCE:g}): a party computes wrongly")
    except (ClusterError, ValueError, RuntimeError) as exc:
        report.problems.append(f"the test job failed: {exc}")
    finally:
        try:
            with _client(cfg, "model-owner", *owner_creds, rpc_timeout=10.0) as owner:
                owner.delete(model_id)
        except (ClusterError, ValueError) as exc:
            report.problems.append(f"the test model {model_id} could not be deleted: {exc}")


def diagnose(cfg: ClusterConfig, job: bool = True, max_skew: float = MAX_SKEW_S,
             owner_creds=(None, None), user_creds=(None, None)) -> Report:
    """Every check; the test job only when every party is up, linked and ready."""
    report = Report()
    role = "query-user" if ("query-user" in cfg.clients or not cfg.tls or
                            user_creds[0]) else "model-owner"
    creds = user_creds if role == "query-user" else owner_creds
    with _client(cfg, role, *creds, rpc_timeout=5.0) as cl:
        check_parties(cfg, cl, report, max_skew)
    if not job:
        report.lines.append("test job: skipped (--no-job)")
    elif report.problems:
        report.lines.append("test job: not run (the parties are not ready)")
    else:
        for what, creds in (("model-owner", owner_creds), ("query-user", user_creds)):
            if cfg.tls and what not in cfg.clients and creds[0] is None:
                report.problems.append(f"the test job needs a {what} certificate: add "
                                       f"[clients.{what}] to the config or pass --no-job")
                return report
        run_test_job(cfg, report, owner_creds, user_creds)
    return report
