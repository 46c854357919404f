"""A party process for benchmarks and tests: ``python -m app.bench_party --config C --id N``.

It runs the production job kinds plus the diagnostic ones (:func:`protocols.jobs.
benchmark_registry`: ``linear``, ``bench_layer``, ``bench_op``), which compute on arbitrary
uploaded tensors and so would hand any model's weights to a query user. Only benchmark
harnesses and tests start it, on throw-away clusters with random weights; ``mpc3 party`` and
``mpc3 cluster up`` never do.
"""
from __future__ import annotations

import argparse
import logging
import sys

from net import config
from net.party.server import serve
from protocols.jobs import benchmark_registry


def name_os_threads() -> None:
    """Give every thread started from now on its Python target's name at the OS level
    (prctl PR_SET_NAME, 15 characters), so /proc/PID/task/*/comm tells gRPC's threads, the
    link reader and the job runner apart (benchmarks/thread_cpu.py reads them)."""
    import ctypes
    import threading
    try:
        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return
    run = threading.Thread.run

    def named_run(self):
        target = getattr(self, "_target", None)
        name = getattr(target, "__qualname__", "") or self.name
        prctl(15, name.rsplit(".", 1)[-1][:15].encode(), 0, 0, 0)
        return run(self)
    threading.Thread.run = named_run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.bench_party", description=__doc__)
    ap.add_argument("--config", required=True)
    ap.add_argument("--id", type=int, required=True, choices=(0, 1, 2))
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--insecure-plaintext-for-local-dev", dest="insecure", action="store_true")
    ap.add_argument("--exit-with-parent", type=int, metavar="PID", default=None)
    a = ap.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = config.load(a.config, insecure_flag=a.insecure)
    name_os_threads()
    from app.localcluster import exit_with_parent
    exit_with_parent(a.exit_with_parent)
    return serve(cfg, a.id, benchmark_registry())


if __name__ == "__main__":
    sys.exit(main())
