"""Startup behaviour a user sees: config layering (TOML file < env < flags), clear errors
for bad configs, and a data directory that only one broker may use at a time."""

import os
import subprocess

from confluent_kafka.admin import AdminClient

from conftest import SLUICE_BIN, Broker, free_port


def run_serve(*args, env=None, timeout=20):
    return subprocess.run([SLUICE_BIN, "serve", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, RUST_BACKTRACE="0", **(env or {})))


def test_second_broker_on_same_data_dir_is_refused(broker):
    result = run_serve("--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(broker.data_dir))
    assert result.returncode != 0
    assert "in use by another process" in result.stderr
    assert broker.is_running()
    AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)


def test_bad_configs_fail_with_the_setting_named(tmp_path):
    cases = [
        (["--num-partitions", "0"], "num_partitions"),
        (["--max-request-bytes", "10"], "max_request_bytes"),
        (["--io-threads", "100000"], "io_threads"),
        (["--log-wal-round-interval-us", "10001"], "log_wal_round_interval_us"),
        (["--advertised-listener", "no-port"], "advertised_listener"),
        (["--flush-messages", "0"], "flush.messages"),
        (["--transaction-state-num-partitions", "0"], "transaction_state_num_partitions"),
        (["--transaction-state-replication-factor=-1"], "transaction_state_replication_factor"),
        (["--node-id", "1", "--cluster-voters", f"1@127.0.0.1:{free_port()}", "--cluster-id", "a\nb"],
         "cluster_id"),
    ]
    for args, named in cases:
        result = run_serve("--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d"), *args)
        assert result.returncode != 0, f"{args} was accepted"
        assert named in result.stderr, f"{args}: error does not name {named}: {result.stderr}"
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text('listen = "127.0.0.1:1"\nno_such_key = 3\n')
    result = run_serve("--config", str(bad_toml), "--data-dir", str(tmp_path / "d"))
    assert result.returncode != 0 and "no_such_key" in result.stderr


def test_toml_file_env_and_flags_layer(tmp_path):
    port = free_port()
    config = tmp_path / "sluice.toml"
    config.write_text(f'listen = "127.0.0.1:1"\nnum_partitions = 2\n[topic_defaults]\nretention_ms = 1234\n')
    # The flag overrides the file's listen address; the env overrides num_partitions.
    broker = Broker(tmp_path / "data", port=port, extra_args=["--config", str(config)],
                    env={"SLUICE_NUM_PARTITIONS": "5"})
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": broker.bootstrap})
        p.produce("layered", b"x")
        assert p.flush(20) == 0
        topic = admin.list_topics("layered", timeout=10).topics["layered"]
        assert len(topic.partitions) == 5
        from confluent_kafka.admin import ConfigResource
        resource = ConfigResource(ConfigResource.Type.TOPIC, "layered")
        configs = admin.describe_configs([resource])[resource].result()
        assert configs["retention.ms"].value == "1234"
    finally:
        broker.kill()
