"""The checks of a stored calibration (protocols.calibration.check, protocols.jobs.
model_problem) without a cluster: the sites a model reaches come from the calibration's own
trace and do not depend on widths; every real calibration passes; every edit the parties and
the client must refuse is refused with one line naming the model, the problem and the next
step; the work does not grow with the config's sizes. Over party processes:
tests/protocols/calibration/test_calibration_trust.py."""
import itertools
import json
import time

import grpc
import numpy as np
import pytest

from app.owner import transformer_meta
from helpers.calibration_edits import ARCHS, BASE, EDITS, LM
from mpc3.party import RingConfig
from net.client.failures import ClusterError
from net.client.user import QueryUser
from net.proto import mpc3_pb2 as pb
from protocols.calibration import calibrate as C
from protocols import model as M
from protocols.layers.attention import default_decode_block
from net.party.service import MAX_META
from protocols.calibration.check import MAX_LAYERS, narrowed, sites_reached
from protocols.jobs import PRODUCTION, model_problem

BLOCK = default_decode_block(BASE["n_features"], BASE["d_head"])        # 11


def _grid():
    """arch x attention x norm x pre/post x FFN activation; a Performer also with max_len
    below, at and above its decode block and unfolded; then the flags of imported and AERO
    models."""
    for arch, att, norm, first, act in itertools.product(ARCHS, M.ATTENTIONS, M.NORMS,
                                                         (True, False), ("relu", "gelu", "none")):
        lens = (BLOCK - 3, BLOCK, BLOCK + 5) if att == M.PERFORMER else (8,)
        for max_len in lens:
            cfg = M.ModelConfig(**BASE, **ARCHS[arch], attention=att, norm=norm,
                                norm_first=first, ffn_act=act, max_len=max_len)
            yield cfg.validate(), True
            if att == M.PERFORMER and max_len == BLOCK + 5:
                yield cfg, False
    lm = dict(**BASE, **ARCHS["decoder-only"], max_len=8, norm_first=True)
    clf = dict(**BASE, **ARCHS["encoder-classifier"], max_len=8, norm_first=False)
    yield M.ModelConfig(**clf, attention="softmax", attn_bias=True, pool="cls-tanh",
                        embedding="learned-ln", type_vocab=2, ffn_act="gelu").validate(), True
    yield M.ModelConfig(**{**lm, "attn_norm": "const"}, attention="softmax", attn_bias=True,
                        embedding="learned", ffn_act="gelu").validate(), True
    yield M.ModelConfig(**lm, attention="softmax", softmax_form="max-free").validate(), True
    yield M.ModelConfig(**lm, ffn_bn=True).validate(), True
    yield M.aero(M.ModelConfig(**lm), scale=True, pruned=1), True


GRID = list(_grid())


def _forms(layers) -> dict:
    """(layer, site) -> whether the value is a [min, max] span."""
    return {(layer, site): isinstance(v, list) for layer, row in layers.items()
            for site, v in row.items()}


def test_sites_follow_the_trace_at_any_width_and_real_calibrations_pass():
    """For every config of the grid: the full calibration (d=16, the owner's default samples
    up to max_len) records exactly the sites, in the same forms, as the trace of the shrunk
    copy at two other widths - so the coverage check follows the trace, whatever sites it
    gains, and never needs the model's widths; and what share-model stores for it (when its
    random weights stay in range) is accepted."""
    accepted = 0
    for cfg, fold in GRID:
        w, user = M.random_weights(cfg, 1), M.random_user(cfg, 1)
        cal = C.calibrate(cfg, w, C.default_samples(cfg, user, np.random.default_rng(0)),
                          user=user, fold_omega=fold, check=False)
        want = _forms(cal.layers)
        assert _forms(sites_reached(cfg, fold)) == want, (cfg, fold)
        assert _forms(sites_reached(cfg, fold, n_heads=3, d_head=3, n_features=5, d_ff=7,
                                    vocab=6)) == want, (cfg, fold)
        try:
            cal.check()
        except C.RangeError:
            continue                          # refused by share-model already
        meta = transformer_meta(cfg, cal, permit=(), fold_omega=fold)   # permits: not read
        assert model_problem("m", json.dumps(meta), PRODUCTION, RingConfig()) == "", cfg
        accepted += 1
    assert len(GRID) > 400 and accepted > 300, (len(GRID), accepted)


def test_narrowed_keeps_structure():
    cfg = GRID[-2][0]                                         # ffn_bn decoder-only
    small = narrowed(cfg)
    assert (small.arch, small.n_dec_layers, small.attention, small.norm, small.ffn_bn,
            small.max_len, small.norm_first) == (cfg.arch, cfg.n_dec_layers, cfg.attention,
                                                 cfg.norm, cfg.ffn_bn, cfg.max_len,
                                                 cfg.norm_first)
    assert (small.d_model, small.d_ff) == (4, 4)


# ------------------------------------------------------------------------ refusals ----
@pytest.fixture(scope="module")
def lm_meta():
    w, user = M.random_weights(LM, 2), M.random_user(LM, 2)
    cal = C.calibrate(LM, w, C.default_samples(LM, user, np.random.default_rng(0)), user=user)
    return transformer_meta(LM, cal)


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_each_edit_is_refused_in_one_line(lm_meta, edit):
    change, why = EDITS[edit]
    meta = json.loads(json.dumps(lm_meta))
    change(meta)
    got = model_problem("lm7", json.dumps(meta), PRODUCTION, RingConfig())
    assert got.startswith("model 'lm7' cannot run: ") and why in got, got
    assert got.endswith("its owner must share it again with 'mpc3 share-model', which "
                        "calibrates it") and "\n" not in got


def test_bare_tensors_and_other_metadata_need_no_calibration(lm_meta):
    for meta in ("", "{}", json.dumps({"purpose": "test"}), "not json"):
        assert model_problem("t", meta, PRODUCTION, RingConfig()) == ""
    assert model_problem("lm", lm_meta, PRODUCTION, RingConfig()) == ""   # parsed, too


def test_the_check_does_not_grow_with_the_config(lm_meta):
    """A config claiming huge widths and length (their decode block recorded to match) is
    traced at the tiny width: quick, whatever the sizes; a config of more layers than the
    metadata can hold rows for is refused before anything is traced."""
    meta = json.loads(json.dumps(lm_meta))
    huge = dict(d_model=1 << 30, n_heads=1 << 10, d_head=1 << 20, n_features=1 << 30,
                d_ff=1 << 34, max_len=1 << 40, tgt_vocab=1 << 40)
    meta["model_config"].update(huge)
    meta["calibration"]["decode_block"] = default_decode_block(1 << 30, 1 << 20)
    t0 = time.perf_counter()
    assert model_problem("big", json.dumps(meta), PRODUCTION, RingConfig()) == ""
    meta["model_config"]["n_dec_layers"] = 1 << 40
    assert "rows for a model of" in model_problem("big", json.dumps(meta), PRODUCTION,
                                                  RingConfig())
    assert time.perf_counter() - t0 < 2.0
    rows = {f"dec.{i}.self": {"wo": 0.0} for i in range(MAX_LAYERS + 1)}   # cheap rows
    meta["calibration"]["layers"].update(rows)
    meta["model_config"]["n_dec_layers"] = MAX_LAYERS + 1
    assert len(json.dumps(meta)) < MAX_META
    t0 = time.perf_counter()
    assert f"(at most {MAX_LAYERS} fit the metadata)" in model_problem(
        "big", json.dumps(meta), PRODUCTION, RingConfig())
    assert time.perf_counter() - t0 < 0.5
    assert MAX_LAYERS * 230 > MAX_META     # the cap is above what the metadata can cover


# ------------------------------------------------------------------------ the client ----
def _user_with(meta: dict, tmp_path) -> QueryUser:
    """A QueryUser that knows model 'lm' by the given public metadata (no party needed:
    check_inputs runs before anything is sent)."""
    from app.localcluster import write_config
    from net import config as cconf
    path = write_config(tmp_path, insecure=True)
    u = QueryUser(cconf.load(path, insecure_flag=True))
    u._models["lm"] = pb.ModelInfo(model_id="lm", upload_id="u1", public_meta=json.dumps(meta))
    return u


@pytest.mark.parametrize("edit", ["missing", "old version", "input range missing",
                                  "site removed"])
def test_client_refuses_to_share_inputs_without_a_valid_calibration(lm_meta, edit, tmp_path):
    meta = json.loads(json.dumps(lm_meta))
    EDITS[edit][0](meta)
    u = _user_with(meta, tmp_path)
    x = np.zeros((1, 3, LM.d_model))
    with pytest.raises(ClusterError) as err:
        u.check_inputs("lm", {"X": x})
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and err.value.party is None
    assert str(err.value).startswith("model 'lm' cannot run: ") and EDITS[edit][1] in \
        str(err.value)
    sent = []
    u._submit_once = lambda *a: sent.append(a)          # submit() refuses before sharing
    with pytest.raises(ClusterError):
        u.submit("lm", "lm_prefill", {"X": x}, {"session": "s"}, upload_id="u1")
    assert sent == []
    u.close()


def test_client_accepts_a_valid_calibration_and_still_checks_the_range(lm_meta, tmp_path):
    u = _user_with(lm_meta, tmp_path)
    lim = lm_meta["calibration"]["input_range"]["X"]
    u.check_inputs("lm", {"X": np.full((1, 3, LM.d_model), lim / 2)})
    with pytest.raises(C.RangeError, match="calibrated input range"):
        u.check_inputs("lm", {"X": np.full((1, 3, LM.d_model), 2 * lim)})
    u.close()
