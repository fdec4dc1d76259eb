"""The Schema Registry served by the broker (`--schema-registry-listen`), driven by a Go program
(tests/go/registry_client) built on franz-go's registry client (pkg/sr) and Kafka client
(pkg/kgo) with Avro by hamba/avro: the schema it registers gets an id and version 1 and keeps
that id when registered again; an evolved schema is judged compatible with a default for the new
field and incompatible without one (the default BACKWARD level), and registers as version 2;
records it encodes in Confluent's wire format come back from the topic decoded, their schema
looked up by the id in their header. What the Go client registered is then seen through the
plain REST API too."""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest

from conftest import free_port
from go_support import registry_client_binary

TOPIC = "go-users"
SUBJECT = f"{TOPIC}-value"
RECORDS = 20
RUN_TIMEOUT_S = 120


@pytest.fixture
def registry(broker_factory):
    """(broker, registry URL) of a broker serving the registry."""
    port = free_port()
    broker = broker_factory(extra_args=["--schema-registry-listen", f"127.0.0.1:{port}"])
    return broker, f"http://127.0.0.1:{port}"


def get(url: str):
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert answer.status == 200, url
        return json.loads(answer.read())


def run_registry_client(bootstrap: str, url: str) -> dict:
    """Runs the Go program to completion and returns its JSON summary."""
    cmd = [str(registry_client_binary()), "-brokers", bootstrap, "-registry", url, "-topic", TOPIC,
           "-records", str(RECORDS), "-timeout", f"{RUN_TIMEOUT_S - 10}s"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} did not finish within {RUN_TIMEOUT_S}s:\n{e.stdout}\n{e.stderr}")
    assert r.returncode == 0, f"$ {' '.join(cmd)}\nexit code {r.returncode}\n{r.stdout}\n{r.stderr}"
    return json.loads(r.stdout)


def test_go_client_registers_evolves_and_round_trips_avro_records(registry):
    broker, url = registry
    summary = run_registry_client(broker.bootstrap, url)

    # Registration: an id, version 1, the same id again for the same schema.
    assert summary["subject"] == SUBJECT
    schema_id = summary["schema_id"]
    assert schema_id > 0 and summary["version"] == 1
    assert summary["reregistered_id"] == schema_id
    assert summary["latest_version"] == 1 and summary["latest_schema_type"] == "AVRO"
    assert summary["subjects"] == [SUBJECT]

    # Evolution under the default level.
    assert summary["global_compatibility"] == "BACKWARD"
    assert summary["compatible_with_default"] is True
    assert summary["compatible_without_default"] is False
    assert any("email" in reason for reason in summary["incompatible_reasons"]), summary["incompatible_reasons"]
    assert summary["evolved"] == {"subject": SUBJECT, "version": 2}
    assert summary["evolved_id"] not in (0, schema_id)
    assert summary["versions"] == [1, 2]

    # Records: encoded with the header naming the schema id, consumed and decoded equal.
    assert summary["produced"] == summary["consumed"] == RECORDS
    assert summary["round_tripped"] is True
    assert summary["header_schema_ids"] == [schema_id]
    assert summary["schema_by_id_type"] == "AVRO" and summary["schema_by_id_matches"] is True
    assert summary["subjects_by_id"] == [SUBJECT]
    assert summary["versions_by_id"] == [{"subject": SUBJECT, "version": 1}]

    # The same registry seen through its REST API.
    assert get(f"{url}/subjects") == [SUBJECT]
    assert get(f"{url}/subjects/{SUBJECT}/versions") == [1, 2]
    v1 = get(f"{url}/subjects/{SUBJECT}/versions/1")
    assert (v1["subject"], v1["version"], v1["id"]) == (SUBJECT, 1, schema_id)
    assert [f["name"] for f in json.loads(v1["schema"])["fields"]] == ["name", "visits"]
    v2 = json.loads(get(f"{url}/schemas/ids/{summary['evolved_id']}")["schema"])
    assert v2["fields"][-1] == {"name": "email", "type": "string", "default": ""}
