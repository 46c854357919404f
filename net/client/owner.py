"""The model owner's client: :class:`ModelOwner` uploads shared weights and deletes models.

It encodes float weights in fixed point (:func:`mpc3.ring.encode`), splits each into
replicated shares with ``os.urandom``-keyed randomness and streams party ``i`` its pair
``(x_i, x_{i+1})`` in chunks of at most 1 MiB, each tensor with a SHA-256 - one tensor at a
time, each chunk's shares made as it is sent (:mod:`net.client.upload`).
All three uploads carry the same random ``upload_id``; if any party refuses, the owner
deletes the model from the others, so the cluster never holds a partial model.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping

import grpc
import numpy as np

from net.proto import mpc3_pb2 as pb

from .base import Client
from .failures import ClusterError
from .upload import TensorFeed


class ModelOwner(Client):
    role = "model-owner"

    def upload(self, model_id: str, weights: Mapping[str, np.ndarray],
               public_meta: Mapping | None = None, encoded: bool = False,
               extra_frac: Mapping[str, int] | None = None) -> str:
        """Share and upload ``weights`` (floats, or ring arrays if ``encoded``), then verify
        that the parties hold consistent copies.

        ``extra_frac``: tensors encoded with more fractional bits than the cluster's frac
        (name -> extra bits); recorded per tensor by the parties.

        Returns the upload id. On any refusal the model is deleted from the parties that
        accepted it and :class:`ClusterError` is raised.
        """
        if not weights:
            raise ValueError("no tensors to upload")
        upload_id = os.urandom(8).hex()
        fracs = {k: self.frac + (extra_frac or {}).get(k, 0) for k in weights}
        meta = json.dumps(dict(public_meta or {}), sort_keys=True)

        feed = TensorFeed.of(weights, fracs, encoded)

        def send(n: int):
            try:
                return self._call(n, "UploadModelShares",
                                  feed.messages(n, fracs, model_id, upload_id, meta),
                                  timeout=max(self.timeout, 600))
            except BaseException as exc:
                feed.abort(exc)
                raise

        try:
            feed.raise_first([e for _, e in self._settled(send)])
            self.verify(model_id)
        except ClusterError as exc:
            errors = getattr(exc, "party_errors", [None, None, None])
            for n, err in enumerate(errors):
                if err is None:
                    self._delete_quietly(n, model_id)
            raise
        return upload_id

    def _delete_quietly(self, n: int, model_id: str) -> None:
        try:
            self._call(n, "DeleteModel", pb.ModelRef(model_id=model_id))
        except ClusterError:
            pass

    def delete(self, model_id: str) -> list[str]:
        """Delete the model from every party that holds it; returns one line per party.
        Raises if no party held it or a party refused (other than not holding it)."""
        results = self._settled(lambda n: self._call(n, "DeleteModel",
                                                     pb.ModelRef(model_id=model_id)))
        lines, missing = [], 0
        for n, (_, err) in enumerate(results):
            if err is None:
                lines.append(f"party {n}: deleted")
            elif isinstance(err, ClusterError) and err.code == grpc.StatusCode.NOT_FOUND:
                lines.append(f"party {n}: did not hold it")
                missing += 1
            else:
                raise err
        if missing == 3:
            raise ClusterError(None, grpc.StatusCode.NOT_FOUND,
                               f"no party holds a model {model_id!r}")
        return lines
