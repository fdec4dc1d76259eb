"""The Prometheus endpoint (`--metrics-listen`), scraped over HTTP and parsed by the official
Prometheus Python client's parser: the counters match the traffic a real client sent, and
the health probes answer."""

from __future__ import annotations

import json
import os
import re
import socket
import time
import urllib.error
import urllib.request

import pytest

from prometheus_client.parser import text_string_to_metric_families

import kafka_wire as kw
from conftest import REPO, SLUICE_BIN, free_port
from kafka_wire import Conn, Record, consume_until, create_topic, record_batch


def scrape_text(port: int) -> str:
    """The page `/metrics` answers."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        assert answer.status == 200
        return answer.read().decode()


def scrape(port: int) -> dict:
    """{(sample name, frozenset(labels)): value} of one scrape."""
    text = scrape_text(port)
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_count_what_clients_did_and_probes_answer(broker_factory):
    port = free_port()
    broker = broker_factory(extra_args=["--metrics-listen", f"127.0.0.1:{port}"])
    topic = "metered"
    create_topic(broker.bootstrap, topic, 2)
    before = scrape(port)

    batches = [record_batch([Record(b"v" * 100, key=b"k%d" % i) for i in range(10)]) for _ in range(5)]
    with Conn.to(broker.bootstrap) as conn:
        for i, batch in enumerate(batches):
            assert conn.produce(topic, i % 2, batch)[0] == 0
        produced_bytes = sum(len(b) for b in batches)
        # A refused batch (CRC broken) is not counted as produced bytes.
        corrupt = bytearray(batches[0])
        corrupt[-1] ^= 0xFF
        assert conn.produce(topic, 0, bytes(corrupt))[0] == kw.CORRUPT_MESSAGE
    got = consume_until(broker.bootstrap, topic, {0: 30, 1: 20})
    assert sum(len(v) for v in got.values()) == 50

    after = scrape(port)
    assert value(after, "sluice_produce_bytes_total", topic=topic) == produced_bytes
    # The consumer read every stored batch at least once (a fetch may return a batch again).
    assert value(after, "sluice_fetch_bytes_total", topic=topic) >= produced_bytes
    produce_requests = value(after, "sluice_requests_total", api="Produce") - value(before, "sluice_requests_total", api="Produce")
    assert produce_requests == 6, produce_requests
    assert value(after, "sluice_request_duration_seconds_count", api="Produce") >= 6
    assert value(after, "sluice_requests_total", api="Fetch") >= 1
    # Every acknowledged produce waited for an fsync.
    assert value(after, "sluice_fsync_duration_seconds_count") >= 1
    # Acknowledged batches are in the partitions' tails in memory (the WAL holds them),
    # a chunk of at least 8 KiB (TAIL_CHUNK_BYTES_MIN) for each of the two partitions.
    assert value(after, "sluice_segment_tail_memory_bytes") >= 2 * 8 * 1024
    # No segment has rolled on this new broker: only active segments' files are open.
    assert value(after, "sluice_segment_files_open") == 0
    assert value(after, "sluice_partitions") == 2
    assert value(after, "sluice_leader_partitions") == 2
    assert value(after, "sluice_offline_partitions") == 0
    assert value(after, "sluice_under_replicated_partitions") == 0
    assert value(after, "sluice_active_controller") == 1
    # The gauge counts open client connections: one held open shows, and once every client
    # has closed (the broker sees a close a moment after the client makes it) it drops to 0.
    with Conn.to(broker.bootstrap) as conn:
        conn.metadata([topic])
        assert value(scrape(port), "sluice_connections") >= 1
    deadline = time.monotonic() + 20
    while (open_now := value(scrape(port), "sluice_connections")) != 0:
        assert time.monotonic() < deadline, f"{open_now} connections still counted after every client closed"
        time.sleep(0.1)

    for path, status in (("/healthz", 200), ("/readyz", 200)):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            assert answer.status == status, path
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nothing", timeout=10)
        raise AssertionError("an unknown path must not answer 200")
    except urllib.error.HTTPError as error:
        assert error.code == 404


def test_the_bytes_the_tails_write_to_the_segment_files_are_counted(broker_factory):
    """The tails' writeback (sent by a WAL round every 100 ms at most; a tail's last chunk
    once 64 KiB of whole pages wait) shows in
    `sluice_segment_tail_written_bytes_total`, by mode: direct I/O by default, the page cache
    where the filesystem refuses O_DIRECT (a tmpfs)."""
    port = free_port()
    broker = broker_factory(extra_args=["--metrics-listen", f"127.0.0.1:{port}"])
    topic = "written"
    create_topic(broker.bootstrap, topic, 1)
    batches = [record_batch([Record(b"w" * 1000) for _ in range(100)]) for _ in range(3)]
    with Conn.to(broker.bootstrap) as conn:
        for batch in batches:
            assert conn.produce(topic, 0, batch)[0] == 0
        # The writeback is sent by a WAL round at least 100 ms after the last one.
        time.sleep(0.3)
        assert conn.produce(topic, 0, record_batch([Record(b"kick")]))[0] == 0
    produced = sum(len(b) for b in batches)
    assert produced > 2 * 64 * 1024
    deadline = time.monotonic() + 20
    while True:
        samples = scrape(port)
        direct = value(samples, "sluice_segment_tail_written_bytes_total", mode="direct")
        page_cache = value(samples, "sluice_segment_tail_written_bytes_total", mode="page_cache")
        # At least the whole pages the writeback waits for (WRITEBACK_PAGES_BYTES_MIN); the
        # rest may stay in memory until the WAL's checkpoint (the WAL holds it).
        if direct + page_cache >= 64 * 1024:
            break
        assert time.monotonic() < deadline, f"written: direct {direct}, page cache {page_cache} of {produced}"
        time.sleep(0.2)
    assert ("sluice_segment_tail_written_bytes_total", frozenset({("mode", "page_cache")})) in samples


def test_a_taken_metrics_port_fails_the_start(broker_factory):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match="metrics listener"):
            broker_factory(extra_args=["--metrics-listen", f"127.0.0.1:{port}"])


# The series the dashboard and the alert rules read: Sluice's own and the process ones.
SERIES_NAME = re.compile(r"\b((?:sluice|process)_[a-z0-9_]+)")
ALERT_RULES = REPO / "ops" / "prometheus" / "sluice-alerts.yml"
DASHBOARD = REPO / "ops" / "grafana" / "sluice-dashboard.json"


def alert_rules(text: str) -> list[dict]:
    """The rules of a Prometheus rules file written as ops/prometheus/sluice-alerts.yml is:
    one `- alert:` item per rule, each value on its line, expressions single-quoted (so
    it is read without a YAML library)."""
    rules: list[dict] = []
    for line in text.splitlines():
        item = line.strip()
        if not item or item.startswith("#") or item.startswith("- name:"):
            continue
        key, _, val = item.removeprefix("- ").partition(":")
        val = val.strip()
        if len(val) >= 2 and val[0] == val[-1] == "'":
            val = val[1:-1].replace("''", "'")
        if key == "alert":
            rules.append({"alert": val})
        elif rules and val:
            rules[-1][key] = val
    return rules


def test_the_dashboard_and_the_alert_rules_read_only_series_the_broker_exports(broker_factory):
    """ops/grafana/sluice-dashboard.json (valid JSON) and ops/prometheus/sluice-alerts.yml:
    every series their PromQL names is in a real scrape after producing and consuming in a
    group (a renamed metric would leave a panel empty or an alert silent for good). `up` is
    Prometheus' own series of each scrape."""
    from confluent_kafka import Consumer

    port = free_port()
    broker = broker_factory(extra_args=["--metrics-listen", f"127.0.0.1:{port}"])
    # Per-topic and per-group series appear with the first traffic and the first commit.
    create_topic(broker.bootstrap, "dashboard", 1)
    with Conn.to(broker.bootstrap) as conn:
        assert conn.produce("dashboard", 0, record_batch([Record(b"v%d" % i) for i in range(5)]))[0] == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watched",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["dashboard"])
    deadline = time.monotonic() + 30
    while (msg := consumer.poll(1.0)) is None or msg.error() is not None:
        assert time.monotonic() < deadline, "nothing consumed"
    consumer.commit(message=msg, asynchronous=False)
    consumer.close()
    exported = {name for name, _ in scrape(port)}
    assert "sluice_consumer_group_lag" in exported

    dashboard = json.loads(DASHBOARD.read_text())
    panel_exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(panel_exprs) >= 15
    variables = [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    for expr in panel_exprs + variables:
        names = set(SERIES_NAME.findall(expr))
        assert names and names <= exported, f"dashboard: {expr}: {names - exported} not exported"
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for subject in ("lag", "under-replicated", "offline", "disk free"):
        assert subject in titles, f"no dashboard panel shows {subject}"

    rules = alert_rules(ALERT_RULES.read_text())
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), names
    for wanted in ("SluiceBrokerDown", "SluiceBrokersAbsent", "SluiceUnderReplicatedPartitions",
                   "SluiceOfflinePartitions", "SluiceDataDirDiskLow", "SluiceConsumerLagGrowing",
                   "SluiceRequestLatencyHigh"):
        assert wanted in names, f"no alert {wanted}"
    for rule in rules:
        assert rule.get("severity") in ("warning", "critical"), rule
        assert rule.get("summary"), rule
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "")), rule
        series = set(SERIES_NAME.findall(rule["expr"]))
        assert series or "up{" in rule["expr"], rule
        assert series <= exported, f"{rule['alert']}: {series - exported} not exported"


def test_consumer_group_lag_is_exported(broker_factory):
    from confluent_kafka import Consumer, Producer

    port = free_port()
    broker = broker_factory(extra_args=["--metrics-listen", f"127.0.0.1:{port}"])
    create_topic(broker.bootstrap, "lagging", 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce("lagging", b"v%d" % i)
    assert producer.flush(10) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "laggard",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["lagging"])
    seen = 0
    while seen < 3:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            seen += 1
            if seen == 3:
                consumer.commit(message=msg, asynchronous=False)
    consumer.close()
    samples = scrape(port)
    assert value(samples, "sluice_consumer_group_lag", group="laggard", topic="lagging") == 7
    # A single node has no ISR to change; the counters exist and read zero.
    assert ("sluice_isr_shrinks_total", frozenset()) in samples
    assert value(samples, "sluice_isr_expands_total") == 0


def test_the_figures_match_what_the_bench_measured(broker_factory, tmp_path):
    """`sluice bench` (the smoke workload) against a broker with metrics: the records and
    bytes the broker exports match what the bench sent and what the topic holds."""
    import subprocess

    from confluent_kafka import Consumer, TopicPartition

    port = free_port()
    broker = broker_factory(extra_args=["--metrics-listen", f"127.0.0.1:{port}"])
    result_file = tmp_path / "smoke.json"
    run = subprocess.run(
        [SLUICE_BIN, "bench", str(REPO / "bench/local/workloads/smoke.yaml"),
         "--driver", str(REPO / "bench/local/drivers/local-latency.yaml"), "--bootstrap", broker.bootstrap,
         "--broker-pid", str(broker.proc.pid), "--output", str(result_file)],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    result = json.loads(result_file.read_text())
    sent = result["sluice"]["measuredMessagesSent"]
    assert sent > 0, result["sluice"]

    samples = scrape(port)
    records = {dict(labels)["topic"]: count for (name, labels), count in samples.items()
               if name == "sluice_produce_records_total"}
    produce_bytes = {dict(labels)["topic"]: count for (name, labels), count in samples.items()
                     if name == "sluice_produce_bytes_total"}
    bench_topics = [topic for topic in records if not topic.startswith("__")]
    assert len(bench_topics) == result["topics"], records

    # What the broker counted is what the topic holds (every record the bench sent, in
    # warm-up, measurement and backlog), and at least what the bench measured.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "metrics-check"})
    held = 0
    for topic in bench_topics:
        for partition in range(result["partitions"]):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            held += high - low
    consumer.close()
    counted = sum(records[t] for t in bench_topics)
    assert counted == held, f"broker counted {counted} records, the topics hold {held}"
    assert counted >= sent, f"broker counted {counted} records, the bench measured {sent} sent"
    # Bytes per record: the bench's message size plus record and batch overhead.
    per_record = sum(produce_bytes[t] for t in bench_topics) / counted
    size = result["messageSize"]
    assert size < per_record < size * 1.1, f"{per_record:.0f} bytes per {size}-byte message"
    # Consumers read everything produced at least once.
    fetched = sum(value(samples, "sluice_fetch_bytes_total", topic=t) for t in bench_topics)
    assert fetched >= sum(produce_bytes[t] for t in bench_topics)


def test_an_api_has_series_once_it_has_been_called(broker_factory):
    """A request counter and latency histogram per API the broker has answered, none for
    the others: the page stays small however many APIs the broker serves."""
    port = free_port()
    broker = broker_factory(extra_args=["--metrics-listen", f"127.0.0.1:{port}"])
    request_series = ("sluice_requests_total", "sluice_request_duration_seconds_count",
                      "sluice_request_duration_seconds_sum", "sluice_request_duration_seconds_bucket")

    def apis_with_series(samples: dict) -> set[str]:
        return {dict(labels)["api"] for name, labels in samples if name in request_series}

    text = scrape_text(port)
    assert apis_with_series(scrape(port)) == set()
    assert "sluice_request_duration_seconds" not in text
    # A page with every API's histogram was over 100 KB.
    assert len(text) < 32 * 1024, len(text)

    with Conn.to(broker.bootstrap) as conn:
        error, _ = conn.api_versions()
        assert error == 0
    samples = scrape(port)
    assert apis_with_series(samples) == {"ApiVersions"}
    assert value(samples, "sluice_requests_total", api="ApiVersions") == 1
    assert value(samples, "sluice_request_duration_seconds_count", api="ApiVersions") == 1
    assert value(samples, "sluice_request_duration_seconds_bucket", api="ApiVersions", le="+Inf") == 1

    with Conn.to(broker.bootstrap) as conn:
        conn.metadata([])
    samples = scrape(port)
    assert "Metadata" in apis_with_series(samples)
    assert "DeleteGroups" not in apis_with_series(samples)
    assert value(samples, "sluice_requests_total", api="ApiVersions") >= 1


def proc_figures(pid: int) -> tuple[float, int]:
    """(CPU seconds, resident bytes) of process `pid`, as the kernel reports them."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    with open(f"/proc/{pid}/statm") as f:
        resident_pages = int(f.read().split()[1])
    # utime and stime: fields 14 and 15 of proc(5); `fields` starts at field 3.
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return cpu, resident_pages * os.sysconf("SC_PAGE_SIZE")


def test_build_process_and_disk_series_tell_what_the_system_does(broker_factory):
    """`sluice_build_info`, the `process_*` series and the data dir's disk space match what
    the kernel says of the broker's process and filesystem."""
    port = free_port()
    started = time.time()
    broker = broker_factory(extra_args=["--metrics-listen", f"127.0.0.1:{port}"])
    create_topic(broker.bootstrap, "busy", 1)
    with Conn.to(broker.bootstrap) as conn:
        for _ in range(20):
            assert conn.produce("busy", 0, record_batch([Record(b"x" * 1000) for _ in range(100)]))[0] == 0

    cpu_before, _ = proc_figures(broker.proc.pid)
    samples = scrape(port)
    cpu_after, resident = proc_figures(broker.proc.pid)
    disk = os.statvfs(broker.data_dir)

    version = re.search(r'^version = "([^"]+)"', (REPO / "Cargo.toml").read_text(), re.M).group(1)
    assert value(samples, "sluice_build_info", version=version) == 1
    builds = [labels for name, labels in samples if name == "sluice_build_info"]
    assert len(builds) == 1, builds

    cpu = value(samples, "process_cpu_seconds_total")
    assert 0 < cpu_before <= cpu <= cpu_after, (cpu_before, cpu, cpu_after)
    scraped_resident = value(samples, "process_resident_memory_bytes")
    assert 0.5 * resident < scraped_resident < 2 * resident, (scraped_resident, resident)
    assert value(samples, "process_virtual_memory_bytes") >= scraped_resident
    # The start time, from the boot time (whole seconds) and the clock ticks after it.
    start = value(samples, "process_start_time_seconds")
    assert started - 2 <= start <= time.time() + 2, (started, start)
    open_fds = value(samples, "process_open_fds")
    assert 0 < open_fds <= value(samples, "process_max_fds")
    # Connections open and close around the scrape: the count is close to the kernel's.
    assert abs(open_fds - len(os.listdir(f"/proc/{broker.proc.pid}/fd"))) <= 20

    total = value(samples, "sluice_data_dir_total_bytes")
    free = value(samples, "sluice_data_dir_free_bytes")
    assert total == disk.f_blocks * disk.f_frsize
    assert 0 < free <= total
    # Others may write on the same filesystem between the scrape and this look.
    assert abs(free - disk.f_bavail * disk.f_frsize) <= max(0.05 * total, 1 << 30)


def test_partition_sizes_grow_with_what_is_produced(broker_factory):
    port = free_port()
    broker = broker_factory(extra_args=["--metrics-listen", f"127.0.0.1:{port}"])
    create_topic(broker.bootstrap, "sized", 2)
    samples = scrape(port)
    assert value(samples, "sluice_partition_size_bytes", topic="sized", partition="0") == 0
    assert ("sluice_partition_size_bytes", frozenset({("topic", "sized"), ("partition", "1")})) in samples
    assert value(samples, "sluice_partition_size_series_omitted") == 0

    batches = [record_batch([Record(b"s" * 500) for _ in range(20)]) for _ in range(4)]
    with Conn.to(broker.bootstrap) as conn:
        for batch in batches:
            assert conn.produce("sized", 0, batch)[0] == 0
    samples = scrape(port)
    # A partition's log holds the batches as they were produced.
    assert value(samples, "sluice_partition_size_bytes", topic="sized", partition="0") == sum(map(len, batches))
    assert value(samples, "sluice_partition_size_bytes", topic="sized", partition="1") == 0
