"""Whether a shared model may run at all: a transformer's stored calibration checked
(:func:`protocols.calibration.check.check_stored`) against the inputs a registry's job kinds
take. Parties ask it when a model is uploaded (nothing is stored if it fails) and before its
jobs (once per upload: a model stored before the check, or whose metadata was edited on
disk); the query user's client asks it before it shares inputs.
"""
from __future__ import annotations

import json
from typing import Mapping

from mpc3.party import RingConfig

from .contract import TRANSFORMER_LAYOUT, JobRegistry, ModelView


def model_problem(model_id: str, public_meta: str | Mapping, registry: JobRegistry,
                  ring: RingConfig) -> str:
    """'' if the model ``model_id`` with public metadata ``public_meta`` (its JSON, or the
    parsed object) may run, else one line naming the model, what is wrong and the owner's
    next step (:func:`protocols.calibration.check.refusal`)."""
    from protocols.calibration.check import check_stored, refusal
    meta = public_meta
    if isinstance(public_meta, str):
        try:
            meta = json.loads(public_meta or "{}")
        except ValueError:
            return ""                     # not a transformer's metadata: nothing to check
    if not isinstance(meta, Mapping) or meta.get("layout") != TRANSFORMER_LAYOUT:
        return ""
    view = ModelView(model_id, {}, dict(meta))
    try:
        cfg = view.config
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return refusal(model_id, f"its model_config is invalid ({exc})")
    try:
        check_stored(meta.get("calibration"), cfg, bool(meta.get("fold_omega", True)),
                     registry.inputs_of(view.kind), ring)
    except ValueError as exc:
        return refusal(model_id, str(exc))
    except Exception as exc:  # noqa: BLE001 - fail closed: refuse this model, serve the others
        return refusal(model_id, f"its calibration could not be checked "
                                 f"({type(exc).__name__}: {exc})")
    return ""
