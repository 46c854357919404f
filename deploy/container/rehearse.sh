#!/usr/bin/env bash
# Build the party image from this repository and run a secure translation through three
# party containers on this host (host networking, TLS, the image's unprivileged user):
#
#   deploy/container/rehearse.sh
#
# Environment: PODMAN (default "podman"; on a host whose cgroups crun refuses, e.g.
# "podman --runtime runc --cgroup-manager cgroupfs"), MPC3_BASE_IMAGE (default the
# Containerfile's python:3.11-slim-bookworm; a machine without Docker Hub can import its own
# Debian root: debootstrap --include=python3,python3-venv bookworm ROOT, then
# tar -C ROOT -c . | podman import - localhost/bookworm-python), PIP_CERT (a CA bundle the
# build's pip must trust, e.g. a package proxy's; mounted into the build), PYTHON (the client's
# interpreter, default python3 with mpc3 importable). Exits non-zero unless the
# translation is right.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PODMAN=${PODMAN:-podman}
PYTHON=${PYTHON:-python3}
TAG=mpc3-party:rehearse-$$
WORK=$(mktemp -d /tmp/mpc3-container-XXXXXX)
NAMES=()
cleanup() {
  for n in "${NAMES[@]}"; do $PODMAN rm -f "$n" >/dev/null 2>&1 || true; done
  $PODMAN rmi -f "$TAG" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
mpc3() { (cd "$REPO" && "$PYTHON" -m app.cli "$@"); }

echo "== wheel"
"$PYTHON" -m pip wheel --quiet --no-deps -w "$WORK/dist" "$REPO"
echo "== image"
CERT_ARGS=()
if [ -n "${PIP_CERT:-}" ]; then
  CERT_ARGS=(-v "$PIP_CERT:/run/pip-ca.pem:ro" --build-arg PIP_CERT=/run/pip-ca.pem)
fi
$PODMAN build --quiet ${MPC3_BASE_IMAGE:+--build-arg BASE=$MPC3_BASE_IMAGE} "${CERT_ARGS[@]}" \
  -f "$HERE/Containerfile" -t "$TAG" "$WORK"
echo "== certificates and config"
C=$WORK/cluster
(cd "$REPO" && "$PYTHON" -c "import sys; from pathlib import Path; from app.localcluster import write_config; write_config(Path(sys.argv[1]))" "$C")
for n in 0 1 2; do
  install -d -m 0700 "$C/data/party-$n"
  chown 7700:7700 "$C/data/party-$n" "$C/certs/party-$n.key"
done
echo "== three party containers"
for n in 0 1 2; do
  NAMES+=("mpc3-rehearse-$$-p$n")
  $PODMAN run -d --name "mpc3-rehearse-$$-p$n" --network host -v "$C:$C" "$TAG" \
    --config "$C/cluster.toml" --id "$n" >/dev/null
done
for _ in $(seq 1 90); do
  if mpc3 status --config "$C/cluster.toml" >/dev/null 2>&1; then break; fi
  sleep 2
done
mpc3 status --config "$C/cluster.toml"
echo "== model owner shares, query user translates"
mpc3 share-model "$REPO/app/assets/translator.npz" --config "$C/cluster.toml" --model-id tr
OUT=$(mpc3 translate --quiet --config "$C/cluster.toml" --model-id tr 4096 2>/dev/null)
echo "$OUT"
[ "$OUT" = "$(printf '4096\tfour thousand ninety six')" ] || { echo "wrong translation" >&2; exit 1; }
echo "container rehearsal passed"
