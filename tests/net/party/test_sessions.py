"""Decode sessions at one party (net.party.sessions, net.party.runner): a refused session-opening
job leaves nothing behind, so the client's retry with the same session id is accepted (issue 33,
item 2: the retry answered ``session id already used`` and translations failed under load);
one user's session ids never meet another's, so a foreign id looks unused."""
import pytest

from helpers.cases import _lm, _x
from net.errors import BadRequest, Code
from net.party.inproc import InprocParties
from net.limits import Limits
from net.party.sessions import SessionStore


def test_a_refused_open_can_be_retried_with_its_id():
    """Party 1 holds user u's only job slot (a job waiting for party 0's start); u's session
    opening is refused there (user_jobs), then, once that job is cancelled, the retry with
    the same session id is accepted."""
    cfg, w = _lm()
    ps = InprocParties.for_model(cfg, w, limits=Limits(user_jobs=1))
    r1, model = ps.runners[1], ps.models[1]
    hold = r1.accept("lm_prefill", "hold", "u", model, ps.upload_id, {"session": "other"},
                     _x())
    with pytest.raises(BadRequest) as err:
        r1.accept("lm_prefill", "open-1", "u", model, ps.upload_id, {"session": "s1"}, _x())
    assert err.value.code == Code.RESOURCE_EXHAUSTED
    r1.cancel(hold, "test")
    job = r1.accept("lm_prefill", "open-2", "u", model, ps.upload_id, {"session": "s1"}, _x())
    assert job.session is not None and job.session.session_id == "s1"
    r1.cancel(job, "test")                        # cancelled before it ran: nothing kept
    r1.accept("lm_prefill", "open-3", "u", model, ps.upload_id, {"session": "s1"}, _x())


def test_session_ids_are_each_users_own():
    st = SessionStore(0, Limits())
    a = st.open("s1", "alice", "m", "u1")
    b = st.open("s1", "bob", "m", "u1")                   # no sign that alice uses s1
    assert a is not b
    st.release(a, True)
    st.release(b, True)
    assert st.acquire("s1", "alice", "m", "u1") is a
    with pytest.raises(BadRequest) as err:                  # carol: as if it did not exist
        st.acquire("s1", "carol", "m", "u1")
    assert err.value.code == Code.NOT_FOUND and "is unknown" in str(err.value)
    with pytest.raises(BadRequest) as err:                  # an opened id is never reused
        st.open("s1", "alice", "m", "u1")
    assert err.value.code == Code.ALREADY_EXISTS
    st.forget(b)                                            # bob's open never completed
    assert st.open("s1", "bob", "m", "u1") is not b and st.count("bob") == 1
