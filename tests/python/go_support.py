"""Build-once of the Go client program of the registry tests (tests/go/registry_client).

`go build` runs only when its go.mod, go.sum or sources changed (a digest stamp next to the
binary), under a file lock so parallel pytest workers build it once. Modules come from the
user's module cache (GOMODCACHE) or the module proxy, pinned by the committed go.sum
(-mod=readonly: a build never edits go.mod or go.sum); nothing is vendored.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from java_support import _digest, _FileLock

REPO = Path(__file__).resolve().parents[2]
REGISTRY_CLIENT_DIR = REPO / "tests" / "go" / "registry_client"
# The Go toolchain: $GO, else `go` on PATH, else where the official tarball installs it.
GO = os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"
BUILD_TIMEOUT_S = 600

_registry_client: Path | None = None


def registry_client_binary() -> Path:
    """Builds tests/go/registry_client (if it changed) into target/go/ and returns the binary."""
    global _registry_client
    if _registry_client is not None:
        return _registry_client
    if shutil.which(GO) is None and not os.access(GO, os.X_OK):
        pytest.fail(f"`{GO}` not found on PATH: install Go (https://go.dev/dl/) to build {REGISTRY_CLIENT_DIR}")
    binary = REPO / "target" / "go" / "registry_client"
    stamp = binary.with_name("registry_client.digest")
    with _FileLock(REPO / ".cache" / "go-build.lock"):
        version = subprocess.run([GO, "version"], capture_output=True, text=True).stdout
        inputs = [REGISTRY_CLIENT_DIR / "go.mod", REGISTRY_CLIENT_DIR / "go.sum",
                  *sorted(REGISTRY_CLIENT_DIR.glob("*.go"))]
        digest = f"{_digest(inputs)} {version.strip()}"
        if not (binary.exists() and stamp.exists() and stamp.read_text() == digest):
            binary.parent.mkdir(parents=True, exist_ok=True)
            cmd = [GO, "build", "-buildvcs=false", "-o", str(binary), "."]
            env = dict(os.environ, GOFLAGS=f"{os.environ.get('GOFLAGS', '')} -mod=readonly".strip())
            try:
                r = subprocess.run(cmd, cwd=REGISTRY_CLIENT_DIR, env=env, capture_output=True, text=True,
                                   timeout=BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired as e:
                pytest.fail(f"{' '.join(cmd)} (in {REGISTRY_CLIENT_DIR}) timed out after {BUILD_TIMEOUT_S}s:\n"
                            f"{e.stdout}\n{e.stderr}")
            if r.returncode != 0:
                pytest.fail(f"{' '.join(cmd)} (in {REGISTRY_CLIENT_DIR}) failed with {r.returncode}:\n"
                            f"{r.stdout[-8000:]}\n{r.stderr[-8000:]}")
            stamp.write_text(digest)
    _registry_client = binary
    return binary


if __name__ == "__main__":
    # Build ahead of the tests (scripts/test.sh does, in its background "test tools" step):
    #   .venv/bin/python tests/python/go_support.py
    print("go registry client:", registry_client_binary())
