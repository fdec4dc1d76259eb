#!/usr/bin/env bash
# Helm, for the chart's tests (helm lint, helm template; tests/python/test_helm_chart.py).
# No prebuilt binary can be fetched here, so it is built from the Go module proxy into
# target/tools (git-ignored), pinned, once, with its module cache under target/go (400 MB):
# 170 CPU-seconds of compilation, 4 minutes on 2 shared cores, about 12 at the lowest
# priority while scripts/test.sh's Rust build has the cores.
#   scripts/helm.sh install     install only (quick when already installed)
#   scripts/helm.sh check       exit status 0 if installed, never builds
#   scripts/helm.sh path        install if needed, then print the binary's path
set -euo pipefail
VERSION=v3.21.4
REPO="$(cd "$(dirname "$0")/.." && pwd)"
ROOT="$REPO/target/tools"
BIN="$ROOT/helm"

# `go install` builds without the release's ldflags, so the binary reports only "v3.21":
# the version installed is kept beside it.
installed() { [ -x "$BIN" ] && [ "$(cat "$ROOT/.helm-version" 2>/dev/null)" = "$VERSION" ]; }
if [ "${1:-}" = check ]; then
  installed
  exit
fi

# One build at a time: the test and scripts/test.sh's prebuild wait for the first one's.
mkdir -p "$ROOT"
exec 9> "$ROOT/.helm-install.lock"
flock 9
if ! installed; then
  GOPATH="$REPO/target/go" GOBIN="$ROOT" GOFLAGS=-modcacherw go install "helm.sh/helm/v3/cmd/helm@$VERSION" >&2
  echo "$VERSION" > "$ROOT/.helm-version"
fi
flock -u 9
exec 9>&-

case "${1:-install}" in
  install) ;;
  path) echo "$BIN" ;;
  *) echo "usage: $0 install | check | path" >&2; exit 2 ;;
esac
