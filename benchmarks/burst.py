"""Load and failure behaviour of a production cluster (three `mpc3 party` processes, mTLS,
default [limits]): the figures of the trust issue, measured.

    python benchmarks/burst.py --json benchmarks/results/trust_burst.json

1. burst: 20 encoder jobs from two users and 4 secure translations from a third, all
   submitted at once, on the shipped translator (permitted: translate, encoder); reports how
   many completed, were refused, their wall times and the peak queue seen by party 0;
2. hang: party 2 is SIGSTOPped after accepting a job; reports how long the client takes to
   fail and its message.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app import translate as T  # noqa: E402
from app.localcluster import LocalCluster  # noqa: E402
from app.owner import share_transformer  # noqa: E402
from mpc3 import ring  # noqa: E402
from mpc3.sharing import deal  # noqa: E402
from net.client.failures import ClusterError  # noqa: E402
from net.codec import tensor_chunks  # noqa: E402
from net.proto import mpc3_pb2 as pb  # noqa: E402
from protocols import model as M  # noqa: E402
from app import textdata as TD  # noqa: E402


def burst(c: LocalCluster, mcfg, user_t, vocab) -> dict:
    rng = np.random.default_rng(0)
    x = M.embed(mcfg, user_t["embed.src"], rng.integers(3, 13, (1, 8)))
    walls, errors, lock = {"job": [], "translation": []}, [], threading.Lock()
    peak = [0]

    def job(stem):
        t0 = time.monotonic()
        try:
            with c.user(stem) as u:
                u.run("tr", "encoder", {"X": x})
            with lock:
                walls["job"].append(time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"job: {exc}")

    def translation(text):
        t0 = time.monotonic()
        try:
            with c.user("user2") as u:
                T.translate_texts(T.ClusterBackend(u, "tr"), mcfg, user_t, [text], vocab)
            with lock:
                walls["translation"].append(time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"translation: {exc}")

    def watch(stop):
        with c.user() as u:
            while not stop.is_set():
                st = u._call(0, "Status", pb.Empty(), 5)
                peak[0] = max(peak[0], st.jobs_queued)
                time.sleep(0.05)

    stop = threading.Event()
    w = threading.Thread(target=watch, args=(stop,))
    w.start()
    threads = [threading.Thread(target=job, args=(("user", "user3")[k % 2],)) for k in range(20)]
    threads += [threading.Thread(target=translation, args=(t,))
                for t in ("4096", "7010", "123", "99")]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = time.monotonic() - t0
    stop.set()
    w.join()
    return {"jobs_completed": len(walls["job"]), "jobs": 20,
            "translations_completed": len(walls["translation"]), "translations": 4,
            "refused_or_failed": errors, "elapsed_s": round(total, 2),
            "job_wall_s": {"median": statistics.median(walls["job"]) if walls["job"] else None,
                           "max": max(walls["job"], default=None)},
            "translation_wall_s": {"max": max(walls["translation"], default=None)},
            "peak_queue_party0": peak[0]}


def hang(c: LocalCluster, mcfg) -> dict:
    x = np.random.default_rng(1).uniform(-1, 1, (1, 8, mcfg.d_model))
    shares = deal(ring.encode(x))
    with c.user() as u:
        info = u.model("tr")
        jid = "hang-" + os.urandom(4).hex()

        def chunks(n):
            head = pb.SubmitChunk(job_id=jid, model_id="tr", upload_id=info.upload_id,
                                  kind="encoder", params_json="{}", n_tensors=1)
            for k, ch in enumerate(tensor_chunks("X", shares[n], 18)):
                if k == 0:
                    head.tensor.CopyFrom(ch)
                    yield head
                else:
                    yield pb.SubmitChunk(job_id=jid, tensor=ch)

        u._call(2, "SubmitJob", chunks(2))
        os.kill(c.procs[2].pid, signal.SIGSTOP)
        try:
            for n in (0, 1):
                u._call(n, "SubmitJob", chunks(n))
            t0 = time.monotonic()
            try:
                u.wait(jid, timeout=c.cfg.job_timeout_s)
                msg = "job finished before the party stopped (no measurement)"
            except ClusterError as exc:
                msg = str(exc)
            took = time.monotonic() - t0
        finally:
            os.kill(c.procs[2].pid, signal.SIGCONT)
    return {"client_failed_after_s": round(took, 2), "peer_timeout_s": c.cfg.peer_timeout_s,
            "job_deadline_s": c.cfg.job_timeout_s, "message": msg}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    mcfg, w, user_t, vocab = TD.load_shipped()
    d = Path(tempfile.mkdtemp(prefix="mpc3-burst-"))
    from net import keys
    c = LocalCluster(d, peer_timeout=30.0, tied=True)
    keys_dir = d / "certs"
    c.start()
    try:
        keys.issue(keys_dir, "user3", "user3", "query-user")
        share_transformer(c.cfg, "tr", mcfg, w, ["translate", "encoder"], *c.creds("owner"),
                          user=user_t)
        result = {"workload": "trust/burst+hang", "limits": c.cfg.limits.to_table(),
                  "burst": burst(c, mcfg, user_t, vocab), "hang": hang(c, mcfg),
                  "load_avg_1m_at_end": os.getloadavg()[0]}
    finally:
        c.stop()
    text = json.dumps(result, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
