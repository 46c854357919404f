"""Generation on a party that stops (SIGSTOP) mid-way, over three real party processes:
the query user's error names the party within about the parties' own timeout (issue 33,
item 7: ``mpc3 generate`` waited 60 s - its 30 s call deadline, then as long again to close
the session - where the parties give up after peer_timeout_s = 30 s)."""
import os
import signal
import time

import numpy as np
import pytest

from app.generate import generate
from app.translate import ClusterBackend
from app.localcluster import LocalCluster
from app.owner import share_transformer
from net.client.user import QueryUser
from net.client.failures import ClusterError
from protocols import model as M

PEER_TIMEOUT = 3.0


def test_generation_fails_naming_a_stopped_party_within_the_peer_timeout(tmp_path):
    cfg = M.ModelConfig(d_model=16, n_heads=2, d_head=8, n_features=8, d_ff=32, attn_c=0.125,
                        attn_norm="mean", norm_first=True, max_len=16, arch="decoder-only",
                        n_dec_layers=1, tgt_vocab=260).validate()
    w, user = M.random_weights(cfg, 5), M.random_user(cfg, 5)
    cluster = LocalCluster(tmp_path / "c", peer_timeout=PEER_TIMEOUT, tied=True)
    with cluster.start(wait=240):             # compiling the kernels may be slow on a busy host
        share_transformer(cluster.cfg, "lm", cfg, w, None, *cluster.creds("owner"),
                          source="random", user=user)
        stopped = []

        def stop_party_2(k, tok):
            if k == 1:
                os.kill(cluster.procs[2].pid, signal.SIGSTOP)
                stopped.append(time.monotonic())

        try:
            with QueryUser(cluster.cfg, *cluster.creds("user")) as qu:   # the CLI's defaults
                backend = ClusterBackend(qu, "lm", step_timeout=120)
                with pytest.raises(ClusterError) as err:
                    generate(backend, cfg, user, np.array([[1, 2, 3]]), 8,
                             on_token=stop_party_2)
                took = time.monotonic() - stopped[0]
        finally:
            os.kill(cluster.procs[2].pid, signal.SIGCONT)
    assert err.value.party == 2 and "party 2 did not answer in time" in str(err.value)
    assert "\n" not in str(err.value)
    assert took < 2.5 * PEER_TIMEOUT, took
