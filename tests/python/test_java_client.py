"""The official Java client (org.apache.kafka:kafka-clients 4.3.1) against a real `sluice serve`.

The checks live in tests/java/src/main/java/sluice/tests/ClientRoundTrip.java; each run exits
non-zero with "FAIL: <what differed>" on the first mismatch.
"""

import pytest

from java_support import java_cp, run_java  # noqa: F401  (java_cp is a fixture)

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
RECORDS = 100_000
PARTITIONS = 16


def _assert_passed(res, broker, what):
    assert res.returncode == 0 and f"PASS {what}" in res.stdout, (
        f"ClientRoundTrip --mode {what} failed\n{res.report()}\n--- broker log (tail) ---\n{broker.log()[-6000:]}"
    )


@pytest.mark.parametrize("codec", CODECS)
def test_java_round_trip(broker, java_cp, codec):
    """Admin creates a 16-partition topic; 100,000 records (keys, null keys, null/empty values,
    headers incl. duplicate keys and null values, explicit CreateTime timestamps) are produced with
    acks=all and the given compression; every ack lands on the default partitioner's partition at
    a contiguous offset; a group-less consumer (assign + seekToBeginning) reads every record back
    identical and in send order per partition, nothing more; endOffsets/beginningOffsets/position
    agree; offsetsForTimes and Admin.listOffsets (earliest, latest, maxTimestamp, forTimestamp)
    return the exact offsets and timestamps."""
    res = run_java(
        java_cp,
        "sluice.tests.ClientRoundTrip",
        ["--mode", "roundtrip", "--bootstrap", broker.bootstrap, "--compression", codec,
         "--records", RECORDS, "--partitions", PARTITIONS],
        timeout=180,
    )
    _assert_passed(res, broker, "roundtrip")
    assert f"produced {RECORDS} records with compression={codec}" in res.stdout
    assert f"consumed and verified {RECORDS} records" in res.stdout
    assert broker.is_running(), f"broker died\n{broker.log()[-6000:]}"


def test_java_admin(broker, java_cp):
    """describeCluster (one node at the bootstrap address, which is also the controller);
    createTopics with configs (a second create -> TopicExistsException); listTopics;
    describeTopics (leader/replicas/ISR = the node); describeConfigs shows creation configs and
    defaults; incrementalAlterConfigs SET / DELETE round-trip (bad value and unknown name ->
    InvalidConfigurationException, nothing changed); deleteRecords moves the low watermark
    (beginningOffsets, listOffsets earliest, and a consumer from the beginning all start there;
    beyond the high watermark -> OffsetOutOfRangeException); createPartitions 16 -> 20 with a
    produce/consume on the new partition (shrinking -> InvalidPartitionsException); deleteTopics
    (gone from listTopics, describe/delete again -> UnknownTopicOrPartitionException, the other
    topic untouched)."""
    res = run_java(java_cp, "sluice.tests.ClientRoundTrip", ["--mode", "admin", "--bootstrap", broker.bootstrap],
                   timeout=180)
    _assert_passed(res, broker, "admin")
    for step in ["describeCluster:", "createTopics/listTopics/describeTopics ok",
                 "describeConfigs/incrementalAlterConfigs ok", "deleteRecords ok", "createPartitions ok",
                 "deleteTopics/listTopics ok"]:
        assert step in res.stdout, res.report()
    assert broker.is_running(), f"broker died\n{broker.log()[-6000:]}"
