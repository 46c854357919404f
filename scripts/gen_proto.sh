#!/usr/bin/env bash
# Regenerate net/proto/mpc3_pb2.py and mpc3_pb2_grpc.py from net/proto/mpc3.proto.
# Needs grpcio-tools as pinned in the "dev" extra (pip install -e '.[dev]'); other versions
# emit other version guards. The generated files are committed;
# tests/net/test_net_proto.py checks that regenerating gives identical files.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root}"
cd "$root"
"${PYTHON:-python}" -m grpc_tools.protoc -I . --python_out="$out" --grpc_python_out="$out" net/proto/mpc3.proto
