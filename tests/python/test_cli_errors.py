"""`sluice serve` refusing a bad start as an operator reads it: an unknown configuration key
named with the closest known ones, a host name accepted by --listen, and no data dir left
behind by a start that failed."""

import socket
import subprocess
import time

from conftest import SLUICE_BIN, free_port

# A refused start says so within this.
REFUSAL_S = 20


def serve(*args, data_dir):
    return subprocess.run([SLUICE_BIN, "serve", "--data-dir", str(data_dir), *args], capture_output=True, text=True,
                          timeout=REFUSAL_S)


def test_an_unknown_key_is_named_with_the_closest_known_ones(tmp_path):
    data_dir = tmp_path / "data"
    res = serve("--listen", f"127.0.0.1:{free_port()}", "--override", "num.partitions=3", data_dir=data_dir)
    assert res.returncode != 0
    assert res.stderr == ("error: invalid configuration: unknown configuration key num.partitions "
                          "(did you mean num_partitions?)\n"), res.stderr
    res = serve("--listen", f"127.0.0.1:{free_port()}", "--override", "cluster.voter=1@127.0.0.1:9093",
                data_dir=data_dir)
    assert res.returncode != 0
    assert res.stderr == ("error: invalid configuration: unknown configuration key cluster.voter "
                          "(did you mean cluster.voters?)\n"), res.stderr
    assert not data_dir.exists()


def test_a_failed_start_leaves_no_new_data_dir_behind(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    data_dir = tmp_path / "fresh"
    res = serve("--listen", f"127.0.0.1:{port}", data_dir=data_dir)
    taken.close()
    assert res.returncode != 0
    assert f"error: listener PLAINTEXT on 127.0.0.1:{port}: Address already in use" in res.stderr, res.stderr
    assert not data_dir.exists(), sorted(p.name for p in data_dir.iterdir())


def test_listen_takes_a_host_name(tmp_path):
    port = free_port()
    broker = subprocess.Popen([SLUICE_BIN, "serve", "--listen", f"localhost:{port}", "--data-dir", str(tmp_path / "d")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + REFUSAL_S
        while True:
            assert broker.poll() is None, broker.stderr.read()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the broker did not listen"
                time.sleep(0.05)
        listed = subprocess.run([SLUICE_BIN, "topic", "list", "-b", f"localhost:{port}"], capture_output=True,
                                text=True, timeout=REFUSAL_S)
        assert listed.returncode == 0, listed.stderr
    finally:
        broker.kill()
        broker.wait()
    bad = serve("--listen", "no-such-host.invalid:9092", data_dir=tmp_path / "never")
    assert bad.returncode != 0
    assert "no-such-host.invalid:9092 is not a host:port that resolves" in bad.stderr, bad.stderr
