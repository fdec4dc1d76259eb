#!/usr/bin/env bash
# A real S3-compatible server for the tiered-storage tests: s3s-fs, which serves a plain
# directory over the S3 API (a bucket is a subdirectory of the root). No prebuilt binary can
# be fetched here, so it is built from crates.io into target/tools (git-ignored), pinned, once
# (1.5 to 3 minutes on 2 cores).
# 0.14.1 is the newest s3s-fs whose rust-version (1.92) the stable toolchain meets.
#   scripts/s3_server.sh install          install only (quick when already installed)
#   scripts/s3_server.sh check            exit status 0 if installed, never builds
#   scripts/s3_server.sh run DIR PORT     serve DIR on 127.0.0.1:PORT in the foreground, with
#                                         access key `sluice`, secret key `sluice-secret`
set -euo pipefail
VERSION=0.14.1
ROOT="$(cd "$(dirname "$0")/.." && pwd)/target/tools"
BIN="$ROOT/bin/s3s-fs"

installed() { [ "$("$BIN" --version 2>/dev/null)" = "s3s-fs $VERSION" ]; }
if [ "${1:-}" = check ]; then
  installed
  exit
fi

# One build at a time: test workers starting together (and scripts/test.sh's prebuild) wait
# for the first one's build instead of each building it again.
mkdir -p "$ROOT"
exec 9> "$ROOT/.s3s-fs-install.lock"
flock 9
if ! installed; then
  cargo install --quiet --root "$ROOT" s3s-fs --version "$VERSION" --locked --features binary >&2
fi
flock -u 9
exec 9>&-

case "${1:-install}" in
  install) ;;
  run)
    [ $# -eq 3 ] || { echo "usage: $0 run DIR PORT" >&2; exit 2; }
    mkdir -p "$2"
    exec "$BIN" --host 127.0.0.1 --port "$3" --access-key sluice --secret-key sluice-secret "$2"
    ;;
  *) echo "usage: $0 install | check | run DIR PORT" >&2; exit 2 ;;
esac
