"""What the one-run benchmark scripts (latency.py, throughput.py) share: running one ``mpc3
bench`` command for its JSON, and their provenance - which commit (and whether the tree was
dirty), the machine's CPUs, when, and the load average at start and end (other jobs on a
shared machine inflate the times)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench(args: list[str]) -> dict:
    """The JSON of ``mpc3 bench ARGS`` run in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        subprocess.run([sys.executable, "-m", "app.cli", "bench", *args, "--json", str(out)],
                       check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        return json.loads(out.read_text())


def start(benchmark: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from app.bench.op import provenance
    return {"benchmark": benchmark, **provenance(),
            "cpus": os.cpu_count(), "load_avg_1m_at_start": os.getloadavg()[0],
            "started": time.strftime("%F %T")}


def finish(result: dict, path: Path | None) -> None:
    """Record the load at the end, print the JSON and write it to ``path`` (if given)."""
    result["load_avg_1m_at_end"] = os.getloadavg()[0]
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        Path(path).write_text(text + "\n")

