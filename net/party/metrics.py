"""A party's metrics for a Prometheus server: jobs by kind and outcome, traffic, queue wait
and per-user usage, served as text exposition format 0.0.4 on ``GET /metrics``.

Off by default; on with ``metrics_listen = "127.0.0.1:9700"`` in the party's ``[[party]]``
table or ``mpc3 party --metrics ADDR``. The endpoint has no TLS and no authentication:
bind it to localhost (or a monitoring network) and firewall it. What it shows is public
by construction - counts, sizes, times and the users' certificate names (CN), which the
operator knows anyway - never a job's inputs, outputs, shares or a model's contents:
:meth:`Metrics.job_finished` takes the counters of a job, not the job.

Traffic is the peer-link payload of jobs as the communicator counts it
(:class:`mpc3.comm.CommStats`): ``bytes_sent`` is what a job's JobStatus reports to the
client for this party, so the client's cost and a scrape agree.
"""
from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

log = logging.getLogger("mpc3.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: queue wait histogram buckets, seconds (party 0 queues; parties 1, 2 wait for its start)
WAIT_BUCKETS = (0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0)


def _label(value) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**kw) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in kw.items()) + "}" if kw else ""


def _num(v) -> str:
    return repr(float(v)) if isinstance(v, float) else str(int(v))


class Metrics:
    """Counters of one party, updated by the job runner, read by the HTTP endpoint."""

    def __init__(self, rank: int, version: str = "") -> None:
        self.rank, self.version = rank, version
        self.started = time.time()
        self._lock = threading.Lock()
        self.jobs: dict[tuple[str, str], int] = {}          # (kind, outcome) -> jobs
        self.traffic: dict[str, list] = {}                  # kind -> [sent, recv, msgs,
        #                                                      rounds, seconds]
        self.users: dict[tuple[str, str], int] = {}         # (user CN, kind) -> jobs
        self.user_bytes: dict[str, int] = {}                # user CN -> input bytes
        self.wait_counts = [0] * (len(WAIT_BUCKETS) + 1)
        self.wait_sum = 0.0
        self.kernels_s: float | None = None
        self.gauges: Callable[[], dict[str, float]] = dict

    def job_finished(self, kind: str, user: str, outcome: str, stats=None,
                     wall_s: float = 0.0, wait_s: float | None = None,
                     input_bytes: int = 0) -> None:
        """One job ended (``outcome`` done / failed / cancelled); ``stats``: its
        :class:`mpc3.comm.CommStats` (None if it never ran); ``wait_s``: seconds between
        its submission and its start (None if it never started)."""
        with self._lock:
            self.jobs[(kind, outcome)] = self.jobs.get((kind, outcome), 0) + 1
            self.users[(user, kind)] = self.users.get((user, kind), 0) + 1
            self.user_bytes[user] = self.user_bytes.get(user, 0) + int(input_bytes)
            t = self.traffic.setdefault(kind, [0, 0, 0, 0, 0.0])
            if stats is not None:
                t[0] += stats.bytes_sent
                t[1] += stats.bytes_received
                t[2] += stats.messages
                t[3] += stats.rounds
            t[4] += wall_s
            if wait_s is not None:
                i = next((i for i, b in enumerate(WAIT_BUCKETS) if wait_s <= b),
                         len(WAIT_BUCKETS))
                self.wait_counts[i] += 1
                self.wait_sum += wait_s

    def render(self) -> str:
        """The text exposition (format 0.0.4)."""
        out: list[str] = []

        def family(name: str, kind: str, text: str, samples) -> None:
            out.append(f"# HELP {name} {text}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(f"{name}{labels} {_num(v)}" for labels, v in samples)

        with self._lock:
            jobs, traffic = dict(self.jobs), {k: list(v) for k, v in self.traffic.items()}
            users, user_bytes = dict(self.users), dict(self.user_bytes)
            waits, wait_sum = list(self.wait_counts), self.wait_sum
        gauges = self.gauges()
        family("mpc3_party_info", "gauge", "this party's rank and wire protocol version",
               [(_labels(rank=self.rank, version=self.version), 1)])
        family("mpc3_uptime_seconds", "gauge", "seconds since the party started",
               [("", time.time() - self.started)])
        if self.kernels_s is not None:
            family("mpc3_kernels_compile_seconds", "gauge", "seconds the secure kernels took "
                   "to compile or load before the party served", [("", self.kernels_s)])
        for name, text in (("jobs_running", "jobs computing now"),
                           ("jobs_queued", "jobs waiting to start"),
                           ("models", "intact models stored")):
            if name in gauges:
                family(f"mpc3_{name}", "gauge", text, [("", gauges[name])])
        family("mpc3_jobs_total", "counter", "jobs ended, by kind and outcome",
               [(_labels(kind=k, outcome=o), n) for (k, o), n in sorted(jobs.items())])
        for i, (name, text) in enumerate((
                ("bytes_sent", "peer-link payload bytes this party sent in jobs"),
                ("bytes_received", "peer-link payload bytes this party received in jobs"),
                ("messages", "peer-link messages this party sent in jobs"),
                ("rounds", "communication rounds of jobs on this party"))):
            family(f"mpc3_job_{name}_total", "counter", text,
                   [(_labels(kind=k), t[i]) for k, t in sorted(traffic.items())])
        family("mpc3_job_seconds_total", "counter", "wall time of jobs from start to end",
               [(_labels(kind=k), t[4]) for k, t in sorted(traffic.items())])
        cum, rows = 0, []
        for b, n in zip((*WAIT_BUCKETS, "+Inf"), waits):
            cum += n
            rows.append((_labels(le=b if b == "+Inf" else repr(float(b))), cum))
        family("mpc3_job_queue_wait_seconds", "histogram", "seconds from a job's submission "
               "to its start", [])
        out.extend(f"mpc3_job_queue_wait_seconds_bucket{lab} {v}" for lab, v in rows)
        out.append(f"mpc3_job_queue_wait_seconds_sum {_num(float(wait_sum))}")
        out.append(f"mpc3_job_queue_wait_seconds_count {cum}")
        family("mpc3_user_jobs_total", "counter", "jobs ended, by user (certificate CN) and "
               "kind", [(_labels(user=u, kind=k), n) for (u, k), n in sorted(users.items())])
        family("mpc3_user_input_bytes_total", "counter", "bytes of input shares a user "
               "submitted", [(_labels(user=u), n) for u, n in sorted(user_bytes.items())])
        return "\n".join(out) + "\n"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404, "only /metrics is served here")
            return
        body = self.server.metrics.render().encode()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args) -> None:      # scrapes are not worth a log line each
        pass


class MetricsServer:
    """``GET /metrics`` on ``address`` (host:port) in a daemon thread."""

    def __init__(self, metrics: Metrics, address: str) -> None:
        host, _, port = address.rpartition(":")
        try:
            self.httpd = ThreadingHTTPServer((host.strip("[]") or "127.0.0.1", int(port)),
                                             _Handler)
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"party {metrics.rank}: cannot serve metrics on {address} "
                               f"({exc}); fix metrics_listen or --metrics") from None
        self.httpd.daemon_threads = True
        self.httpd.metrics = metrics
        self.address = f"{host}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True,
                         name="mpc3-metrics").start()
        if host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
            log.warning("party %d: metrics on %s are served without TLS or authentication: "
                        "firewall that port", metrics.rank, self.address)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
