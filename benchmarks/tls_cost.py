"""What the party links' TLS costs on this machine, measured three ways in one run:

1. per MB on loopback: CPU of the sending and of the receiving thread (``time.thread_time``)
   for ``--mb`` MB in 2 MB messages, over a TLS 1.3 socket made with the party links' own
   contexts (:func:`net.peer.tlssock.tls_contexts`, certificates from :func:`net.keys.generate`)
   and over a plain TCP socket;
2. the AES-GCM speed of the system OpenSSL that Python's ``ssl`` links (``openssl speed``,
   16 KiB blocks - a TLS record - if the ``openssl`` command is there);
3. the Table 2 encoder over three party processes with and without TLS
   (``--insecure-plaintext-for-local-dev``): wall (min over ``--repeat``) and each party's
   job-thread CPU per run (:mod:`thread_cpu`).

    python benchmarks/tls_cost.py --json benchmarks/results/tls_cost.json
"""
from __future__ import annotations

import argparse
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import runinfo  # noqa: E402
import thread_cpu  # noqa: E402
from app.bench.remote import RemoteCluster, layer_config  # noqa: E402
from net import keys  # noqa: E402
from net.party import malloc  # noqa: E402
from net.peer.tlssock import tls_contexts  # noqa: E402

MESSAGE = 2 << 20


def _pair(tls: bool):
    """(sender, receiver) connected over loopback: TLS 1.3 with the links' contexts, or TCP."""
    listener = socket.create_server(("127.0.0.1", 0))
    raw_send = socket.create_connection(listener.getsockname())
    raw_recv, _ = listener.accept()
    listener.close()
    for s in (raw_send, raw_recv):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if not tls:
        return raw_send, raw_recv, None
    with tempfile.TemporaryDirectory() as tmp:
        d = keys.generate(Path(tmp))
        server, _ = tls_contexts(d / "party-1.pem", d / "party-1.key", d / "ca.pem")
        _, client = tls_contexts(d / "party-0.pem", d / "party-0.key", d / "ca.pem")
    out = {}
    t = threading.Thread(target=lambda: out.setdefault(
        "r", server.wrap_socket(raw_recv, server_side=True)))
    t.start()
    send = client.wrap_socket(raw_send, server_hostname=keys.party_target_name(1))
    t.join()
    return send, out["r"], send.cipher()[0]


def per_mb(tls: bool, mb: int) -> dict:
    """CPU milliseconds per MB of the sending and of the receiving thread."""
    send, recv, cipher = _pair(tls)
    count, data, sent = mb * (1 << 20) // MESSAGE, bytes(MESSAGE), {}
    buf = bytearray(MESSAGE)
    view = memoryview(buf)

    def sender():
        t0 = time.thread_time()
        for _ in range(count):
            send.sendall(data)
        sent["cpu"] = time.thread_time() - t0

    th = threading.Thread(target=sender)
    t0 = time.thread_time()
    th.start()
    for _ in range(count):
        got = 0
        while got < MESSAGE:
            got += recv.recv_into(view[got:])
    recv_cpu = time.thread_time() - t0
    th.join()
    send.close()
    recv.close()
    total = count * MESSAGE / 1e6
    return {"cipher": cipher, "send_ms_per_mb": 1e3 * sent["cpu"] / total,
            "recv_ms_per_mb": 1e3 * recv_cpu / total}


def openssl_speed() -> dict | None:
    """GB/s of AES-128-GCM and AES-256-GCM on 16 KiB blocks, by the ``openssl`` command."""
    if shutil.which("openssl") is None:
        return None
    out = {"version": ssl.OPENSSL_VERSION}
    for c in ("aes-128-gcm", "aes-256-gcm"):
        r = subprocess.run(["openssl", "speed", "-seconds", "1", "-bytes", "16384", "-evp", c],
                           capture_output=True, text=True)
        m = re.search(r"^AES-\d+-GCM\s+([\d.]+)k", r.stdout, re.M)
        out[c + "_gb_per_s"] = float(m.group(1)) * 1e3 / 1e9 if m else None
    return out


def encoder(insecure: bool, repeat: int) -> dict:
    """The encoder over three party processes: wall and job-thread CPU per run and party."""
    cfg = layer_config()
    with RemoteCluster("none", quiet=True, insecure=insecure) as rc:
        rc.bench_layer("encoder", cfg, repeat=1)            # compiled, links up
        s0 = thread_cpu.snapshot()
        r = rc.bench_layer("encoder", cfg, repeat=repeat, warmup=False)
        d = thread_cpu.delta(s0, thread_cpu.snapshot())
    # the job runs on its own thread, which has ended: the process's CPU less its live threads'
    return {"tls": not insecure, "wall_s": r["wall_s"],
            "bytes_per_party": r["bytes_per_party"],
            "job_cpu_s_per_run": [d[f"party {n}"]["(ended threads)"] / repeat for n in range(3)]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=400, help="MB per loopback measurement")
    ap.add_argument("--repeat", type=int, default=4, help="encoder runs per setting")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    malloc.keep_freed_memory()                  # as a party process (net.party.server.serve)
    result = runinfo.start("tls_cost")
    result["loopback"] = {"tls": per_mb(True, a.mb), "tcp": per_mb(False, a.mb)}
    result["openssl_speed"] = openssl_speed()
    result["encoder"] = [encoder(insecure, a.repeat) for insecure in (False, True, False, True)]
    runinfo.finish(result, a.json)


if __name__ == "__main__":
    main()
