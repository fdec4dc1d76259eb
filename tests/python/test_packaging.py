"""What ships besides the binary: shell completions and manual pages generated from the
CLI definition, and the .deb (packaging/build-deb.sh) installed for real: its files, its
user, and the broker started as its systemd unit says, serving with the packaged config.
The Helm chart is checked in test_helm_chart.py, the example config by a unit test
(crates/cli/src/serve.rs)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import REPO, SLUICE_BIN, free_port

UNIT = "/lib/systemd/system/sluice.service"


def sluice(*args: str) -> str:
    return subprocess.run([SLUICE_BIN, *args], capture_output=True, text=True, check=True, timeout=30).stdout


def test_bash_completion_completes_subcommands_and_flags(tmp_path):
    script = tmp_path / "sluice.bash"
    script.write_text(sluice("completions", "bash"))
    subprocess.run(["bash", "-n", str(script)], check=True)

    def complete(*words: str) -> list[str]:
        line = " ".join(shlex.quote(w) for w in words)
        probe = (f"source {shlex.quote(str(script))}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
                 f"COMP_LINE={shlex.quote(' '.join(words))}; COMP_POINT=${{#COMP_LINE}}; "
                 # As bash calls a completion function: the command, the word, the one before.
                 f"_sluice sluice {shlex.quote(words[-1])} {shlex.quote(words[-2])}; "
                 "printf '%s\\n' \"${COMPREPLY[@]}\"")
        out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout
        return out.split()

    assert {"cluster", "completions"} <= set(complete("sluice", "c")), complete("sluice", "c")
    assert "health" in complete("sluice", "cluster", "")
    assert "--wait" in complete("sluice", "cluster", "health", "--w")


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_completions_name_the_subcommands(shell):
    script = sluice("completions", shell)
    assert "dev-cluster" in script and "serve" in script
    if shutil.which(shell):
        subprocess.run([shell, "-n"], input=script, text=True, check=True)


def test_manual_pages_render(tmp_path):
    page = tmp_path / "sluice.1"
    page.write_text(sluice("manpage"))
    # -ww: every warning; -z: no output, only the checks.
    groff = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(page)], capture_output=True, text=True)
    assert groff.returncode == 0 and groff.stderr == "", groff.stderr
    # -P-cbou: plain text, no overstrike bold or underline.
    rendered = subprocess.run(["groff", "-man", "-Tutf8", "-P-cbou", str(page)], capture_output=True, text=True,
                              check=True).stdout
    assert "NAME" in rendered and "A Kafka-protocol streaming broker" in rendered
    assert "dev-cluster" in rendered

    pages = tmp_path / "pages"
    sluice("manpage", "--dir", str(pages))
    serve = (pages / "sluice-serve.1").read_text()
    assert "\\-\\-config" in serve and "\\-\\-metrics\\-listen" in serve
    assert (pages / "sluice-cluster-health.1").exists()


def readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return answer.status
    except (urllib.error.URLError, OSError):
        return 0


def unit_setting(unit: str, key: str) -> str:
    values = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(f"{key}=")]
    assert len(values) == 1, f"{key} in {UNIT}: {values}"
    return values[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="installing a .deb (dpkg -i) needs root")
@pytest.mark.skipif(shutil.which("dpkg") is None, reason="not a Debian system: no dpkg")
def test_the_deb_installs_and_serves_as_its_unit_says(tmp_path):
    if os.path.exists("/usr/bin/sluice"):
        owner = subprocess.run(["dpkg", "-S", "/usr/bin/sluice"], capture_output=True, text=True)
        if owner.returncode != 0 or not owner.stdout.startswith("sluice:"):
            pytest.skip("/usr/bin/sluice exists and is not from the sluice package: not overwriting it")
    deb = subprocess.run(["bash", str(REPO / "packaging/build-deb.sh"), SLUICE_BIN, str(tmp_path)],
                         env=dict(os.environ, DEB_COMPRESSION="none"), capture_output=True, text=True, check=True,
                         timeout=120).stdout.strip()
    subprocess.run(["dpkg", "-i", deb], capture_output=True, text=True, check=True, timeout=120)
    proc = None
    try:
        for path in ("/usr/bin/sluice", UNIT, "/etc/sluice/sluice.toml", "/usr/share/man/man1/sluice.1.gz",
                     "/usr/share/bash-completion/completions/sluice", "/usr/share/doc/sluice/copyright"):
            assert os.path.exists(path), path
        subprocess.run(["id", "sluice"], check=True, capture_output=True)
        assert os.stat("/var/lib/sluice").st_uid == int(subprocess.run(["id", "-u", "sluice"], capture_output=True,
                                                                          text=True).stdout)
        unit = open(UNIT).read()
        assert unit_setting(unit, "User") == "sluice"
        assert unit_setting(unit, "Restart") == "on-failure"
        assert int(unit_setting(unit, "LimitNOFILE")) >= 65536
        exec_start = shlex.split(unit_setting(unit, "ExecStart"))
        assert exec_start == ["/usr/bin/sluice", "serve", "--config", "/etc/sluice/sluice.toml"]
        config = open("/etc/sluice/sluice.toml").read()
        assert 'data_dir = "/var/lib/sluice"' in config

        # systemd is not PID 1 here: start the unit's command as its user, in its working
        # directory. Flags on top move the ports off the defaults other tests may use.
        port, metrics = free_port(), free_port()
        user = unit_setting(unit, "User")
        proc = subprocess.Popen(
            # setpriv execs the command itself: the SIGTERM below reaches the broker.
            ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *exec_start,
             "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics}"],
            cwd=unit_setting(unit, "WorkingDirectory"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while readyz(metrics) != 200:
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
            assert time.monotonic() < deadline, "the packaged broker did not become ready"
            time.sleep(0.1)
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        admin.create_topics([NewTopic("packaged", num_partitions=1, replication_factor=1)])["packaged"].result(30)
        assert os.path.isdir("/var/lib/sluice/logs/packaged-0"), os.listdir("/var/lib/sluice")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        proc = None
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        subprocess.run(["dpkg", "--purge", "sluice"], capture_output=True, text=True, check=True, timeout=120)
        # Purge keeps the data and the user (only an operator decides the data may go):
        # this machine is left as it was found.
        shutil.rmtree("/var/lib/sluice", ignore_errors=True)
        subprocess.run(["deluser", "--system", "sluice"], capture_output=True)
        subprocess.run(["delgroup", "--system", "sluice"], capture_output=True)
    assert not os.path.exists("/usr/bin/sluice")
    assert not os.path.exists(UNIT)
