"""Limits of one party without a network (issue 33, items 1, 6, 7): blocking calls and
streams counted per user, per organisation and in all; decode sessions per organisation;
the organisation read from a certificate's O; a job that does not reach all three parties
takes no running slot and is dropped everywhere at ``job_arrival_s``; JSON parameters
bounded before they are parsed."""
import json

import numpy as np

import pytest
from cryptography import x509

from net import keys
from net.errors import BadRequest, Code
from net.party.inproc import InprocParties
from net.limits import Limits, Quotas
from net.proto import mpc3_pb2 as pb
from net.party.service import MAX_JSON_DEPTH, MAX_PARAMS, json_value
from net.party.sessions import SessionStore
from helpers.cases import _lm, _x

S = pb.JobStatusReply


def _refused(fn, *args) -> str:
    with pytest.raises(BadRequest) as err:
        fn(*args)
    assert err.value.code == Code.RESOURCE_EXHAUSTED
    return str(err.value)


def test_blocking_calls_are_limited_per_user_organisation_and_in_all():
    q = Quotas(Limits(user_blocking_calls=2, org_blocking_calls=3, blocking_calls=4), 1)
    held = [q.blocking_call("a1", "acme"), q.blocking_call("a1", "acme"),
            q.blocking_call("a2", "acme")]
    for h in held:
        h.__enter__()
    msg = _refused(lambda: q.blocking_call("a1", "acme").__enter__())
    assert msg.startswith("party 1: user 'a1' already has 2 calls waiting on this party "
                          "(limit user_blocking_calls = 2 in [limits])")
    msg = _refused(lambda: q.blocking_call("a3", "acme").__enter__())  # a fresh identity
    assert "organisation 'acme' already has 3" in msg and "org_blocking_calls = 3" in msg
    with q.blocking_call("bob", ""):                       # another organisation: served
        assert "limit blocking_calls = 4" in _refused(
            lambda: q.blocking_call("carol", "").__enter__())
    held[2].__exit__(None, None, None)                     # released: a3 may call again
    with q.blocking_call("a3", "acme"):
        pass


def test_one_organisation_cannot_take_every_stream():
    """Before: streams = 32 was filled by 8 identities of one organisation (4 each)."""
    lim = Limits()
    q = Quotas(lim, 0)
    held, refused = [], []
    for k in range(9):                                     # 9 identities of acme
        for _ in range(lim.user_streams):
            cm = q.stream(f"acme{k}", "acme")
            try:
                cm.__enter__()
                held.append(cm)
            except BadRequest as exc:
                refused.append(str(exc))
    assert len(held) == lim.org_streams < lim.streams
    assert refused and all("limit org_streams = 16 in [limits]" in r for r in refused)
    for k in range(lim.streams - lim.org_streams):         # the rest is left to others
        held.append(q.stream(f"other{k}", f"org{k}"))
        held[-1].__enter__()
    assert "limit streams = 32" in _refused(lambda: q.stream("late", "").__enter__())


def test_one_organisation_cannot_take_every_session():
    lim = Limits(user_sessions=2, org_sessions=3, sessions=5)
    st = SessionStore(2, lim)
    for k in range(3):
        st.open(f"s{k}", f"acme{k}", "m", "u", org="acme")
    with pytest.raises(BadRequest) as err:
        st.open("s9", "acme9", "m", "u", org="acme")
    assert err.value.code == Code.RESOURCE_EXHAUSTED
    assert "organisation 'acme' already keeps 3 sessions (limit org_sessions = 3" in \
        str(err.value)
    st.open("s1", "bob", "m", "u")                         # no organisation: its own
    st.open("s1", "carol", "m", "u", org="globex")
    with pytest.raises(BadRequest, match="limit sessions = 5"):
        st.open("s2", "bob", "m", "u")


def test_limits_table_orders_user_org_and_total():
    assert Limits.from_table({"org_streams": 8}).org_streams == 8
    with pytest.raises(ValueError, match="user_streams = 4 <= org_streams = 2"):
        Limits.from_table({"org_streams": 2})
    with pytest.raises(ValueError, match="org_sessions = 70 <= sessions = 64"):
        Limits.from_table({"org_sessions": 70})
    assert Limits.from_table({"streams": 8}).org_streams == 8     # a smaller total: lower


def test_certificate_organisation(tmp_path):
    keys.create_ca(tmp_path)
    cert, _ = keys.issue(tmp_path, "a1", "a1", "query-user", org="acme")
    plain, _ = keys.issue(tmp_path, "u", "u", "query-user")
    assert keys.identity_from_pem(cert.read_bytes()) == keys.Identity("a1", "query-user",
                                                                      "acme")
    assert keys.identity_from_pem(plain.read_bytes()).org == ""   # O = mpc3: no organisation
    subject = x509.load_pem_x509_certificate(plain.read_bytes()).subject.rfc4514_string()
    assert "O=mpc3" in subject


# ------------------------------------------------------------------------- arrival ----
def _parties(**limits) -> InprocParties:
    cfg, w = _lm()
    return InprocParties.for_model(cfg, w, limits=Limits(**limits))


def _accept(ps, r, job_id, owner="u", session=None):
    return ps.runners[r].accept("lm_prefill", job_id, owner, ps.models[r], ps.upload_id,
                                {"session": session or job_id}, _x())


def test_a_job_on_party_0_only_takes_no_running_slot_and_is_dropped():
    """Before: party 0 started it at once and held its running slot for the peer timeout
    (8 such jobs kept another user's 1-row job waiting 22-29.5 s)."""
    ps = _parties(running_jobs=1, job_arrival_s=5)
    lone = _accept(ps, 0, "lone", "mallory")
    assert lone.state == S.QUEUED and ps.runners[0].counts() == (0, 1)
    assert ps.runners[0].expire(30.0) == [] and lone.state == S.QUEUED     # not yet late
    jobs = [_accept(ps, r, "fair", "alice") for r in (1, 2, 0)]    # the only slot is free
    for job in jobs:
        assert job.done.wait(60) and job.state == S.DONE, job.error
    assert lone.state == S.QUEUED
    lone.submitted -= 10.0                                         # its deadline has passed
    assert ps.runners[0].expire(30.0) == ["lone"]
    assert lone.state == S.FAILED and lone.started is None
    assert "did not reach party 1 and party 2 within 5 s (limit job_arrival_s" in lone.error


def test_a_job_party_0_never_received_is_dropped_on_the_others():
    ps = _parties(job_arrival_s=5)
    stray = _accept(ps, 1, "stray")
    half = _accept(ps, 2, "half")
    assert stray.state == half.state == S.QUEUED
    ps.runners[0]._early["stray"] = (ps.runners[0]._early["stray"][0], 0.0)   # long ago
    ps.runners[0].expire(30.0)
    assert stray.state == S.FAILED and "party 0 dropped the job" in stray.error
    assert half.state == S.QUEUED                          # not yet late
    lone = _accept(ps, 0, "half")                          # party 1 never gets it
    assert lone.have == {2} and lone.state == S.QUEUED
    lone.submitted -= 10.0
    ps.runners[0].expire(30.0)
    assert "did not reach party 1 within" in lone.error
    assert half.state == S.FAILED and "party 0 dropped the job" in half.error


def test_a_job_cancelled_on_a_follower_is_cancelled_on_party_0():
    """Before: party 0 would start it later and wait the peer timeout for party 1."""
    ps = _parties(running_jobs=1)
    ps.runners[0]._running = 1                 # party 0's only slot is busy
    on1, on2, on0 = (_accept(ps, r, "next", "bob") for r in (1, 2, 0))
    assert on0.state == S.QUEUED and not ps.runners[0]._pending    # in the fair queue
    ps.runners[1].cancel(on1, "cancelled by bob")
    assert on0.state == S.CANCELLED and on0.started is None
    assert "party 1 will not run it" in on0.error
    assert on2.state == S.FAILED and "party 0 dropped the job" in on2.error


# ---------------------------------------------------------------------- parameters ----
def test_deep_or_long_params_are_refused_before_parsing():
    deep = "[" * 30000 + "]" * 30000
    assert len(deep) <= MAX_PARAMS
    for text, msg in ((deep, f"params_json is nested 30000 levels deep (at most "
                                f"{MAX_JSON_DEPTH})"),
                      ("[" * 50000 + "]" * 50000, f"params_json is 100000 characters long "
                                                  f"(at most {MAX_PARAMS})"),
                      ('{"a": ', "params_json: Expecting value")):
        with pytest.raises(BadRequest) as err:
            json_value(text, "params_json", MAX_PARAMS)
        assert err.value.code == Code.INVALID_ARGUMENT and str(err.value).startswith(msg)
    ok = {"session": "s[[[[{{", "nested": [[[{"a": 1}]]]}
    assert json_value(json.dumps(ok), "params_json", MAX_PARAMS) == ok


# -------------------------------------------------------------------------- client ----
def test_client_waits_for_a_party_as_long_as_the_parties_wait_for_each_other(tmp_path):
    from app.localcluster import write_config
    from net import config as cconf
    from net.client.user import QueryUser
    path = write_config(tmp_path, insecure=True, peer_timeout=2.5)
    with QueryUser(cconf.load(path, insecure_flag=True)) as u:    # was 60 s
        assert u.timeout == 2.5


def test_a_failure_is_reported_without_waiting_for_a_silent_party(tmp_path):
    """Party 0 reports the job failed (party 2 stopped answering it); party 2's own status
    never comes. Before, wait() waited for every party's answer and then for each
    cancellation: on a stopped party ``mpc3 generate`` took twice the parties' timeout."""
    import threading
    import time

    import grpc

    from app.localcluster import write_config
    from net import config as cconf
    from net.client.user import QueryUser
    from net.client.failures import ClusterError, JobFailed
    path = write_config(tmp_path, insecure=True, peer_timeout=2.0)
    release = threading.Event()

    def status(n, job_id, wait_s, timeout=None):
        if n == 2:
            release.wait(30)
            raise ClusterError(2, grpc.StatusCode.DEADLINE_EXCEEDED, "party 2 did not answer")
        if n == 1:
            time.sleep(min(wait_s, 0.2))
        return S(job_id=job_id, state=S.FAILED if n == 0 else S.RUNNING, error=(
            "party 0: no message 7 from party 2 within 2 s" if n == 0 else "")), []

    asked = []
    with QueryUser(cconf.load(path, insecure_flag=True)) as u:
        u._status = status
        u._call = lambda n, method, request, timeout=None: asked.append((n, method))
        t0 = time.monotonic()
        with pytest.raises(JobFailed) as err:
            u.wait("j1")
        took = time.monotonic() - t0
    release.set()
    assert took < 5.0, took
    assert "party 2 stopped answering" in str(err.value) and "when party 2 is back" in \
        str(err.value)
    assert {(0, "CancelJob"), (1, "CancelJob")} <= set(asked)


def test_a_session_is_not_closed_after_the_cluster_failed_its_job():
    """The failed job dropped the session where it ran; a close would wait for the party
    that stopped answering (its whole timeout)."""
    from app.generate import generate
    from app.translate import JobRun
    from mpc3 import ring
    from net.client.failures import JobFailed
    from protocols import model as M

    cfg, _ = _lm()
    user = M.random_user(cfg, 1)

    class Backend:
        frac, fuse = 18, None

        def __init__(self, fail):
            self.fail, self.closed = fail, []

        def job(self, kind, inputs, session, params=None):
            if kind == "lm_prefill":
                h = ring.encode(np.zeros((inputs["X"].shape[0], cfg.d_model)), 18)
                return JobRun({"H": h}, [], 0.0, [])
            if kind == "lm_close":
                self.closed.append(session)
                return JobRun({}, [], 0.0, [])
            raise self.fail

    cluster_failed = Backend(JobFailed(2, None, "job j was aborted"))
    with pytest.raises(JobFailed):
        generate(cluster_failed, cfg, user, [[1, 2]], 3)
    assert cluster_failed.closed == []
    interrupted = Backend(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        generate(interrupted, cfg, user, [[1, 2]], 3)
    assert len(interrupted.closed) == 1


def test_a_refused_long_poll_is_followed_by_a_short_one(tmp_path):
    """When the long-polls of a party are at their limit (other users' calls fill
    blocking_calls), the client asks without waiting instead of taking the party for
    silent or waiting for a free call."""
    import grpc

    from app.localcluster import write_config
    from net import config as cconf
    from net.client.user import QueryUser
    from net.client.failures import ClusterError
    path = write_config(tmp_path, insecure=True)
    asked = []

    def status(n, job_id, wait_s, timeout=None):
        asked.append((n, wait_s))
        if n == 1 and wait_s > 0:
            raise ClusterError(1, grpc.StatusCode.RESOURCE_EXHAUSTED, "party 1: too many "
                               "calls waiting on this party of all users (limit "
                               "blocking_calls = 24 in [limits]); retry in a few seconds")
        return S(job_id=job_id, state=S.DONE), []

    with QueryUser(cconf.load(path, insecure_flag=True)) as u:
        u._status = status
        assert [s.state for s in u.wait("j2")] == [S.DONE] * 3
    assert (1, 0.0) in asked and sum(1 for n, _ in asked if n == 1) == 2
