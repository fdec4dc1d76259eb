"""The README's five-minute tour, run line by line as a reader would type it: every command
of its shell blocks, against a broker started as the quick start says, must succeed. A
command renamed or a flag changed in the CLI fails here before a reader finds out.

Lines are taken from the ```sh blocks of the "A five-minute tour" section: comments are
dropped, `export NAME=value` sets the environment of the lines after it, `sluice` is the
binary under test, and `sluice dev-cluster` runs in the background until it prints `ready`.
"""

from __future__ import annotations

import os
import re
import selectors
import shlex
import subprocess
import time
from pathlib import Path

from conftest import SLUICE_BIN, Broker, free_port

README = Path(__file__).resolve().parents[2] / "README.md"
COMMAND_TIMEOUT_S = 60
DEV_CLUSTER_READY_TIMEOUT_S = 90


def tour_blocks() -> list[list[str]]:
    """The command lines of each ```sh block of the tour section."""
    text = README.read_text()
    section = text.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    blocks = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        lines = [line.split("  #")[0].strip() for line in block.splitlines()]
        blocks.append([line for line in lines if line and not line.startswith("#")])
    return blocks


def run_line(line: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """One tour line through the shell (pipes as written), `sluice` being the binary under test."""
    shell_line = re.sub(r"(^|\| *)sluice ", lambda m: f"{m.group(1)}{shlex.quote(SLUICE_BIN)} ", line)
    return subprocess.run(["bash", "-o", "pipefail", "-c", shell_line], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=COMMAND_TIMEOUT_S)


def start_dev_cluster(line: str, env: dict, cwd: Path) -> subprocess.Popen:
    args = [SLUICE_BIN, *shlex.split(line)[1:]]
    proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + DEV_CLUSTER_READY_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and selector.select(left), "dev-cluster never ready:\n" + "".join(seen[-30:])
            output = proc.stdout.readline()
            assert output, f"dev-cluster exited ({proc.wait()}):\n" + "".join(seen[-30:])
            seen.append(output)
            if output.startswith("ready "):
                return proc


def test_every_line_of_the_readme_tour_runs(tmp_path):
    blocks = tour_blocks()
    assert blocks, "the README has no tour"
    port = free_port()
    broker = Broker(tmp_path / "quick-start", port=port).start()
    env = {**os.environ, "SLUICE_BOOTSTRAP": broker.bootstrap}
    background = []
    try:
        for block in blocks:
            for line in block:
                assert line.split()[0] in ("sluice", "export", "printf", "echo"), f"not a sluice command: {line}"
                if line.startswith("export "):
                    name, value = line.removeprefix("export ").split("=", 1)
                    env[name] = value
                elif line.startswith("sluice dev-cluster"):
                    background.append(start_dev_cluster(line, env, tmp_path))
                else:
                    done = run_line(line, env, tmp_path)
                    assert done.returncode == 0, f"{line}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
    finally:
        for proc in background:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        broker.stop()


def test_the_help_shows_the_tour():
    """`sluice --help` ends with the tour's first block, taken from the README itself."""
    shown = subprocess.run([SLUICE_BIN, "--help"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    for line in tour_blocks()[0]:
        assert line in shown.stdout, f"{line!r} is not in `sluice --help`"
