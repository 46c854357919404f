"""The committed generated modules are exactly what scripts/gen_proto.sh produces."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_regenerating_gives_identical_files(tmp_path):
    pytest.importorskip("grpc_tools")
    from importlib.metadata import version
    from net.proto import mpc3_pb2_grpc
    if version("grpcio-tools") != mpc3_pb2_grpc.GRPC_GENERATED_VERSION:
        pytest.skip("grpcio-tools differs from the pinned version (pip install -e '.[dev]')")
    import os
    import sys
    subprocess.run(["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)], check=True,
                   cwd=ROOT, env=dict(os.environ, PYTHON=sys.executable))
    for name in ("mpc3_pb2.py", "mpc3_pb2_grpc.py"):
        fresh = (tmp_path / "net" / "proto" / name).read_text()
        assert fresh == (ROOT / "net" / "proto" / name).read_text(), f"{name} is stale"
