"""The web console (`--console-listen`), driven in a real headless Chromium: the overview, the
topics list and its filter, a topic's partitions and configs, its messages (newest, from an
offset, one partition, filtered; keys, values and headers shown as text, JSON, hex, null or
empty; Avro, Protobuf and JSON Schema values decoded by the built-in registry's schemas and
found by a search for what they decode to), a consumer group's members, assignment and lag, its positions moved (a plan shown
first), deleted, and the group deleted, on a laptop-size and a phone-size screen. With SASL users, visitors log in as Kafka clients do and each sees only what its ACLs
allow."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic,
                                   ResourcePatternType, ResourceType, ScramMechanism)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from browser_support import browser, current_text, phone_size, screenshot, wait_for_element, wait_for_text  # noqa: F401
from conftest import REPO, free_port
from test_security import add_user, start_secure_broker

# Where a run that sets it saves a screenshot of each page (the docs' images come from here).
SCREENSHOTS = os.environ.get("SLUICE_CONSOLE_SCREENSHOTS")


def shoot(driver, name: str) -> None:
    if SCREENSHOTS:
        screenshot(driver, os.path.join(SCREENSHOTS, f"{name}.png"), full_page=True)


def create_topic(bootstrap: str, name: str, partitions: int, admin_conf: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **(admin_conf or {})})
    for future in admin.create_topics([NewTopic(name, partitions)]).values():
        future.result(timeout=30)


def texts(driver, css: str) -> list[str]:
    return [element.text for element in driver.find_elements(By.CSS_SELECTOR, css)]


def test_overview_topics_partitions_and_messages_in_the_browser(broker_factory, browser):  # noqa: F811
    port = free_port()
    broker = broker_factory(extra_args=["--console-listen", f"127.0.0.1:{port}"])
    console = f"http://127.0.0.1:{port}"
    create_topic(broker.bootstrap, "orders", 3)
    create_topic(broker.bootstrap, "audit", 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(30):
        producer.produce("orders", key=f"order-{i}", value=f"item {i}", partition=i % 3,
                         headers=[("source", b"web")], timestamp=1_767_225_600_000 + i * 1000)
    producer.produce("orders", key=None, value=json.dumps({"id": 99, "tags": ["a"]}), partition=0)
    producer.produce("orders", key="bin", value=bytes([0xff, 0x00, 0x10]), partition=1)
    producer.produce("orders", key="empty", value=b"", partition=2)
    assert producer.flush(30) == 0

    # The overview counts what the cluster has.
    browser.get(console + "/")
    # Two topics, and the single node's offsets topic.
    wait_for_text(browser, "#topics-count", "3")
    assert browser.find_element(By.ID, "partitions-count").text == "5"
    assert browser.find_element(By.ID, "messages-count").text == "33"
    assert browser.find_element(By.ID, "offline").text == "0"
    assert "controller" in browser.find_element(By.ID, "nodes").text
    shoot(browser, "overview")

    # The topics list filters as one types, and links to each topic.
    browser.find_element(By.LINK_TEXT, "Topics").click()
    wait_for_element(browser, "#topics")
    assert [row.split()[0] for row in texts(browser, "#topics tbody tr")] == ["__consumer_offsets", "audit", "orders"]
    browser.find_element(By.ID, "topic-filter").send_keys("ord")
    wait_for_text(browser, "#topic-list .count", "1 topic(s)")
    row = browser.find_element(By.CSS_SELECTOR, "#topics tbody tr").text.split()
    assert row[:4] == ["orders", "3", "1", "33"], row
    shoot(browser, "topics")
    browser.find_element(By.LINK_TEXT, "orders").click()

    # The topic page: each partition's offsets, and the configs with their source.
    wait_for_text(browser, "#topic-name", "orders")
    ends = [int(cell.text) for cell in browser.find_elements(By.CSS_SELECTOR, "#partitions td.end")]
    assert ends == [11, 11, 11], ends
    configs = browser.find_element(By.ID, "configs").text
    assert "cleanup.policy delete" in configs and "retention.ms" in configs
    shoot(browser, "topic")

    # Messages: the newest of every partition, each shown as what its bytes are.
    browser.find_element(By.ID, "browse").click()
    wait_for_text(browser, "#messages .count", "33 message(s)")
    table = browser.find_element(By.ID, "message-table")
    assert "order-7" in table.text and "item 7" in table.text and "source: web" in table.text
    values = {element.text: element.get_attribute("class") for element in table.find_elements(By.CSS_SELECTOR, "pre.value")}
    assert values['{\n  "id": 99,\n  "tags": [\n    "a"\n  ]\n}'].startswith("json")
    assert values["ff0010"].startswith("binary") and values["(empty)"].startswith("empty")
    assert "null" in [k.text for k in table.find_elements(By.CSS_SELECTOR, "pre.null")]
    shoot(browser, "messages")

    # One partition from an offset, then a filter on the text of the page read.
    Select(browser.find_element(By.ID, "partition")).select_by_value("1")
    Select(browser.find_element(By.ID, "from")).select_by_value("offset")
    browser.find_element(By.ID, "offset").send_keys("5")
    browser.find_element(By.ID, "read").click()
    wait_for_text(browser, "#messages .count", "6 message(s)")
    offsets = [row.split()[:2] for row in texts(browser, "#message-table tbody tr")]
    assert offsets == [["1", str(o)] for o in range(5, 11)], offsets
    browser.find_element(By.ID, "filter").send_keys("order-16")
    browser.find_element(By.ID, "read").click()
    wait_for_text(browser, "#messages .count", "1 message(s)")

    # A consumer-protocol group that read everything, then fell 5 messages behind.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "billing", "group.protocol": "consumer",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe(["orders"])
        read = 0
        while read < 33:
            message = consumer.poll(10)
            assert message is not None and message.error() is None, message and message.error()
            read += 1
        consumer.commit(asynchronous=False)
        for i in range(5):
            producer.produce("orders", value=f"late {i}", partition=0)
        assert producer.flush(30) == 0
        browser.find_element(By.LINK_TEXT, "Groups").click()
        wait_for_element(browser, "#groups")
        assert texts(browser, "#groups tbody tr") == ["billing consumer Stable"]
        browser.find_element(By.LINK_TEXT, "billing").click()
        wait_for_text(browser, "#group-lag", "5")
        assert browser.find_element(By.ID, "group-members").text == "1"
        assert "orders: 0, 1, 2" in browser.find_element(By.ID, "members").text
        lags = [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#positions td.lag")]
        assert sorted(lags) == ["0", "0", "5"], lags
        shoot(browser, "group")
    finally:
        consumer.close()

    # The same page on a phone: everything still reachable.
    phone_size(browser)
    browser.get(console + "/topics/orders/messages")
    wait_for_text(browser, "#messages .count", "38 message(s)")
    assert browser.find_element(By.LINK_TEXT, "Topics").is_displayed()
    shoot(browser, "messages-phone")

    # Pages may run only their own scripts and may not be framed.
    with urllib.request.urlopen(console + "/topics", timeout=10) as answer:
        assert "script-src 'self'" in answer.headers["Content-Security-Policy"]
        assert answer.headers["X-Frame-Options"] == "DENY"


def test_topics_are_created_changed_produced_to_and_deleted_in_the_browser(broker_factory, browser):  # noqa: F811
    port = free_port()
    broker_factory(extra_args=["--console-listen", f"127.0.0.1:{port}"])
    console = f"http://127.0.0.1:{port}"
    browser.get(console + "/topics")
    browser.find_element(By.ID, "create-topic").click()
    wait_for_element(browser, "#new-name").send_keys("payments")
    browser.find_element(By.ID, "new-partitions").send_keys("2")
    browser.find_element(By.ID, "new-configs").send_keys("retention.ms=60000")
    browser.find_element(By.ID, "create").click()
    wait_for_text(browser, "#topic-name", "payments")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")) == 2
    assert "retention.ms 60000 topic" in browser.find_element(By.ID, "configs").text

    def submit(form: str, **fields):
        for field, value in fields.items():
            element = browser.find_element(By.ID, field)
            element.clear()
            element.send_keys(value)
        browser.find_element(By.ID, form).click()

    # Kafka's validation answers, shown as they come.
    submit("config-set", **{"config-key": "retention.ms", "config-value": "soon"})
    wait_for_text(browser, "#refused", "InvalidConfig")
    submit("config-set", **{"config-key": "cleanup.policy", "config-value": "compact"})
    wait_for_text(browser, "#done", "cleanup.policy set to compact")
    assert "cleanup.policy compact topic" in browser.find_element(By.ID, "configs").text
    # A record produced from the page is read back with its key and header.
    submit("produce", **{"produce-partition": "1", "produce-key": "k1", "produce-value": "hello",
                         "produce-headers": "origin: console"})
    wait_for_text(browser, "#done", "produced to partition 1 at offset 0")
    browser.find_element(By.ID, "browse").click()
    wait_for_text(browser, "#messages .count", "1 message(s)")
    row = browser.find_element(By.CSS_SELECTOR, "#message-table tbody tr").text
    assert "k1" in row and "hello" in row and "origin: console" in row
    browser.get(console + "/topics/payments")
    # Partitions grow, never shrink.
    submit("add-partitions", **{"partition-count": "3"})
    wait_for_text(browser, "#done", "now has 3 partitions")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")) == 3
    submit("add-partitions", **{"partition-count": "1"})
    wait_for_text(browser, "#refused", "InvalidPartitions")
    # Deleting asks for the name first.
    submit("delete", **{"delete-confirm": "pay"})
    wait_for_text(browser, "#refused", "type the topic's name")
    submit("delete", **{"delete-confirm": "payments"})
    wait_for_element(browser, "#topics")
    assert "payments" not in browser.find_element(By.ID, "topics").text
    # A form posted from another site changes nothing.
    forged = urllib.request.Request(console + "/create-topic", data=b"name=forged", method="POST",
                                    headers={"Origin": "http://evil.example", "Content-Type": "application/x-www-form-urlencoded"})
    try:
        urllib.request.urlopen(forged, timeout=10)
        raise AssertionError("a cross-site POST was accepted")
    except urllib.error.HTTPError as refused:
        assert refused.code == 403
    browser.get(console + "/topics")
    assert "forged" not in browser.find_element(By.ID, "topics").text
    shoot(browser, "create-topic")


def consume_and_commit(bootstrap: str, group: str, topic: str, count: int) -> Consumer:
    """A member of `group` that has read and committed `count` records of `topic`; still in the group."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    read = 0
    deadline = time.monotonic() + 30
    while read < count and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            read += 1
    assert read == count, f"read {read} of {count}"
    consumer.commit(asynchronous=False)
    return consumer


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = probe.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return [tp.offset for tp in found]
    finally:
        probe.close()


def test_a_groups_positions_are_planned_moved_deleted_and_the_group_deleted_in_the_browser(
        broker_factory, browser):  # noqa: F811
    port = free_port()
    broker = broker_factory(extra_args=["--console-listen", f"127.0.0.1:{port}"])
    console = f"http://127.0.0.1:{port}"
    create_topic(broker.bootstrap, "ledger", 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(20):
        producer.produce("ledger", value=f"entry {i}", partition=i % 2)
    assert producer.flush(30) == 0
    member = consume_and_commit(broker.bootstrap, "auditors", "ledger", 20)

    def submit(button: str, selects: dict | None = None, **fields):
        for field, value in (selects or {}).items():
            Select(browser.find_element(By.ID, field)).select_by_value(value)
        for field, value in fields.items():
            element = browser.find_element(By.ID, field)
            element.clear()
            element.send_keys(value)
        browser.find_element(By.ID, button).click()

    # With a member in the group the plan is shown, and why it cannot be applied.
    browser.get(console + "/groups/auditors")
    wait_for_text(browser, "#group-lag", "0")
    submit("plan-reset", {"reset-to": "earliest"})
    wait_for_text(browser, "#refused", "has an active member")
    assert texts(browser, "#plan tbody tr") == ["ledger 0 10 0", "ledger 1 10 0"]
    assert not browser.find_elements(By.ID, "apply-reset")
    member.close()

    # Empty, the group's positions move once the plan is confirmed.
    browser.get(console + "/groups/auditors")
    submit("plan-reset", {"reset-to": "shift"}, **{"reset-value": "-4"})
    wait_for_element(browser, "#apply-reset")
    assert texts(browser, "#plan tbody tr") == ["ledger 0 10 6", "ledger 1 10 6"]
    assert committed(broker.bootstrap, "auditors", "ledger", 2) == [10, 10], "a plan alone changed the offsets"
    browser.find_element(By.ID, "apply-reset").click()
    wait_for_text(browser, "#done", "moved 2 positions of group auditors")
    assert browser.find_element(By.ID, "group-lag").text == "8"
    assert committed(broker.bootstrap, "auditors", "ledger", 2) == [6, 6]
    # Bad input is refused with the reason.
    submit("plan-reset", {"reset-to": "offset"}, **{"reset-value": "soon"})
    wait_for_text(browser, "#refused", "the offset must be a whole number")

    # Deleting the group asks for its id first.
    submit("delete-group", **{"delete-group-confirm": "audit"})
    wait_for_text(browser, "#refused", "type the group's id")
    submit("delete-group", **{"delete-group-confirm": "auditors"})
    wait_for_element(browser, "#groups")
    assert "auditors" not in browser.find_element(By.ID, "groups").text
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    listed = admin.list_consumer_groups().result(timeout=10)
    assert "auditors" not in [g.group_id for g in listed.valid]

    # Another group's positions in one topic are deleted, the rest kept.
    create_topic(broker.bootstrap, "journal", 1)
    producer.produce("journal", value="j0")
    producer.produce("journal", value="j1")
    assert producer.flush(30) == 0
    positions = [TopicPartition("ledger", 0, 3), TopicPartition("journal", 0, 1)]
    for future in admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions("archivists", positions)]).values():
        future.result(timeout=10)
    browser.get(console + "/groups/archivists")
    submit("delete-offsets", {"delete-offsets-topic": "ledger"})
    wait_for_text(browser, "#done", "deleted the positions of group archivists in ledger")
    assert texts(browser, "#positions tbody tr") == ["journal 0 1 2 1"]


def chart_values(driver, css: str) -> tuple[int, int, int]:
    """(points, last, largest) of a chart as the page shows it now."""
    chart = driver.find_element(By.CSS_SELECTOR, css)
    return tuple(int(chart.get_attribute(f"data-{name}")) for name in ("points", "last", "max"))


def wait_for_chart(driver, css: str, done, timeout: float = 30) -> tuple[int, int, int]:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        try:
            seen = chart_values(driver, css)
            if done(*seen):
                return seen
        except Exception:  # the chart is being swapped in place
            pass
        time.sleep(0.3)
    raise AssertionError(f"{css}: (points, last, max) stayed {seen}")


def line_last(driver, chart: str, name: str, timeout: float = 30) -> int:
    """The last value of the line called `name` of a chart, once the chart draws it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for line in driver.find_elements(By.CSS_SELECTOR, f'{chart} polyline[data-name="{name}"]'):
                return int(line.get_attribute("data-last"))
        except Exception:  # the chart is being swapped in place
            pass
        time.sleep(0.3)
    raise AssertionError(f"{chart} drew no line {name}")


def test_a_groups_lag_rises_and_falls_on_its_chart_and_topics_show_their_rate(broker_factory, browser):  # noqa: F811
    port = free_port()
    broker = broker_factory(extra_args=["--console-listen", f"127.0.0.1:{port}",
                                        "--override", "console_history_interval_ms=1000"])
    console = f"http://127.0.0.1:{port}"
    create_topic(broker.bootstrap, "clicks", 2)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    # The group starts at offset 0 of each partition, with nothing to read yet.
    offsets = [TopicPartition("clicks", p, 0) for p in range(2)]
    for future in admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions("trend", offsets)]).values():
        future.result(timeout=10)
    browser.get(console + "/groups/trend")
    wait_for_chart(browser, "#lag-chart", lambda points, last, top: points >= 2 and last == 0)

    # 60 records arrive: the lag rises on the chart, which redraws itself in place.
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(60):
        producer.produce("clicks", value=f"click {i}", partition=i % 2)
    assert producer.flush(30) == 0
    wait_for_chart(browser, "#lag-chart", lambda points, last, top: last == 60)
    # The group reads them: the lag falls back, and the chart keeps the peak.
    consume_and_commit(broker.bootstrap, "trend", "clicks", 60).close()
    points, last, top = wait_for_chart(browser, "#lag-chart", lambda points, last, top: last == 0 and top == 60)
    shoot(browser, "group-lag")

    # The topic's and the cluster's messages per second saw the 60 records.
    browser.get(console + "/topics/clicks")
    wait_for_chart(browser, "#rate-chart", lambda points, last, top: top > 0)
    browser.get(console + "/")
    wait_for_chart(browser, "#cluster-rate-chart", lambda points, last, top: top > 0)
    # This node's own load saw them too: bytes in per second, and the produce requests'
    # p99 latency over the intervals that had some (the chart's first line).
    wait_for_chart(browser, "#node-traffic-chart", lambda points, last, top: top > 0)
    _, produce_p99_us, _ = wait_for_chart(browser, "#node-latency-chart", lambda points, last, top: points >= 1)
    assert 0 < produce_p99_us < 10_000_000, produce_p99_us
    assert line_last(browser, "#node-latency-chart", "Fetch") > 0
    shoot(browser, "overview-load")
    # The day's window keeps every 30th sample, from the first.
    browser.get(console + "/groups/trend")
    browser.find_element(By.LINK_TEXT, "last day").click()
    wait_for_chart(browser, "#lag-chart", lambda points, last, top: points >= 1)
    assert "window=24h" in browser.current_url
    # The chart's own route (what the page polls) draws the same.
    with urllib.request.urlopen(console + "/groups/trend/lag-chart", timeout=10) as answer:
        assert b'data-max="60"' in answer.read()


def test_a_topic_is_searched_on_the_broker_with_progress_and_a_cap(broker_factory, browser):  # noqa: F811
    port = free_port()
    broker = broker_factory(extra_args=["--console-listen", f"127.0.0.1:{port}"])
    console = f"http://127.0.0.1:{port}"
    create_topic(broker.bootstrap, "orders", 3)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
    for i in range(3000):
        value = json.dumps({"customer": {"id": i % 100}, "total": i})
        producer.produce("orders", key=f"order-{i}", value=value, partition=i % 3,
                         headers=[("channel", b"shop" if i == 1234 else b"app")])
        producer.poll(0)
    assert producer.flush(30) == 0

    def search(**fields):
        browser.get(console + "/topics/orders/messages")
        browser.find_element(By.CSS_SELECTOR, "#search-box summary").click()
        for field, value in fields.items():
            if field == "search-field":
                Select(browser.find_element(By.ID, field)).select_by_value(value)
            else:
                browser.find_element(By.ID, field).send_keys(value)
        browser.find_element(By.ID, "search").click()
        wait_for_element(browser, "#search-state")
        deadline = time.monotonic() + 30
        while current_text(browser, "#search-state") == "searching" and time.monotonic() < deadline:
            time.sleep(0.3)
        return current_text(browser, "#search-state")

    # One key among 3,000, found on the broker: every record read, one row shipped.
    assert search(**{"search-text": "ORDER-2999", "search-field": "key"}) == "done: every record read"
    assert browser.find_element(By.ID, "search-scanned").text == "3000"
    rows = texts(browser, "#search-table tbody tr")
    assert len(rows) == 1 and "order-2999" in rows[0], rows
    # A header's value, and a JSON field's value (30 orders of customer 7).
    search(**{"search-text": "shop", "search-field": "headers"})
    assert len(texts(browser, "#search-table tbody tr")) == 1
    search(**{"search-json": "customer.id=7"})
    assert browser.find_element(By.ID, "search-found").text == "30"
    # A search that matches everything stops at its cap and says so.
    assert search(**{"search-text": "order"}) == "stopped at 500 matches: narrow the search"
    assert len(texts(browser, "#search-table tbody tr")) == 500
    shoot(browser, "search")
    # Nothing to look for is refused; an unknown search is not found.
    search_page = browser.current_url
    browser.get(console + "/topics/orders/messages")
    browser.find_element(By.CSS_SELECTOR, "#search-box summary").click()
    browser.find_element(By.ID, "search").click()
    wait_for_text(browser, "#error", "say what to look for")
    with urllib.request.urlopen(search_page, timeout=10) as answer:
        assert answer.status == 200
    try:
        urllib.request.urlopen(console + "/topics/orders/search/0123456789abcdef", timeout=10)
        raise AssertionError("an unknown search was found")
    except urllib.error.HTTPError as missing:
        assert missing.code == 404


def test_schema_framed_values_are_shown_decoded_and_found_by_what_they_decode_to(
        broker_factory, browser):  # noqa: F811
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from test_schema_registry import order_message_class

    port, registry_port = free_port(), free_port()
    broker = broker_factory(extra_args=["--console-listen", f"127.0.0.1:{port}",
                                        "--schema-registry-listen", f"127.0.0.1:{registry_port}"])
    console = f"http://127.0.0.1:{port}"
    client = SchemaRegistryClient({"url": f"http://127.0.0.1:{registry_port}"})
    payment = json.dumps({"type": "record", "name": "Payment", "namespace": "shop", "fields": [
        {"name": "payer", "type": "string"}, {"name": "cents", "type": "long"},
        {"name": "currency", "type": {"type": "enum", "name": "Currency", "symbols": ["EUR", "USD"]}}]})
    event = json.dumps({"type": "object", "properties": {"kind": {"type": "string"}, "basket": {"type": "string"}}})
    order = order_message_class()
    produced = {
        "payments": (AvroSerializer(client, payment), [{"payer": "ada", "cents": 1250, "currency": "EUR"},
                                                       {"payer": "grace", "cents": 990, "currency": "USD"}]),
        "orders": (ProtobufSerializer(order, client, {"use.deprecated.format": False}), [order(id=41, item="teapot")]),
        "events": (JSONSerializer(event, client), [{"kind": "checkout", "basket": "b-77"}]),
    }
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for topic, (serializer, values) in produced.items():
        create_topic(broker.bootstrap, topic, 1)
        for value in values:
            producer.produce(topic, serializer(value, SerializationContext(topic, MessageField.VALUE)))
    producer.produce("payments", value=b"plain text")
    assert producer.flush(30) == 0
    ids = {topic: client.get_latest_version(f"{topic}-value").schema_id for topic in produced}

    # Each value shows as the JSON its schema decodes it to, labelled with the schema.
    browser.get(console + "/topics/payments/messages")
    wait_for_text(browser, "#message-table .value", '"payer": "grace"')
    values = texts(browser, "#message-table .value")
    assert any('"currency": "USD"' in value and '"cents": 990' in value for value in values), values
    assert "plain text" in values, values
    assert texts(browser, "#message-table .schema") == [f"avro · schema {ids['payments']}"] * 2
    shoot(browser, "messages-decoded")
    browser.get(console + "/topics/orders/messages")
    wait_for_text(browser, "#message-table .value", '"item": "teapot"')
    assert '"id": "41"' in texts(browser, "#message-table .value")[0]
    assert texts(browser, "#message-table .schema") == [f"protobuf · schema {ids['orders']}"]
    browser.get(console + "/topics/events/messages")
    wait_for_text(browser, "#message-table .value", '"basket": "b-77"')
    assert texts(browser, "#message-table .schema") == [f"json-schema · schema {ids['events']}"]
    # The raw bytes on asking: the magic byte and the schema id lead them.
    Select(browser.find_element(By.ID, "decode")).select_by_value("raw")
    browser.find_element(By.ID, "read").click()
    wait_for_element(browser, "#message-table .binary")
    assert texts(browser, "#message-table .value")[0].startswith(f"00{ids['events']:08x}7b")
    assert texts(browser, "#message-table .schema") == []

    def search(field: str, value: str) -> list[str]:
        browser.get(console + "/topics/payments/messages")
        browser.find_element(By.CSS_SELECTOR, "#search-box summary").click()
        browser.find_element(By.ID, field).send_keys(value)
        browser.find_element(By.ID, "search").click()
        wait_for_text(browser, "#search-state", "done")
        return texts(browser, "#search-table tbody tr")

    # A search finds a value by what it decodes to: the enum's symbol is not in its bytes.
    rows = search("search-text", "usd")
    assert len(rows) == 1 and "grace" in rows[0] and f"avro · schema {ids['payments']}" in rows[0], rows
    rows = search("search-json", "currency=EUR")
    assert len(rows) == 1 and '"payer": "ada"' in rows[0], rows


def test_the_console_over_https_logs_in_with_a_secure_cookie_and_samples_as_the_brokers_user(
        broker_factory, tmp_path):
    port = free_port()
    secure = start_secure_broker(broker_factory, tmp_path, "--console-listen", f"127.0.0.1:{port}", "--console-tls",
                                 "--override", "console_history_interval_ms=1000")
    admin = secure.admin()
    add_user(admin, "alice", "alice-secret", [ScramMechanism.SCRAM_SHA_512])
    create_topic(secure.broker.bootstrap, "visits", 1)
    positions = [TopicPartition("visits", 0, 0)]
    for future in admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions("readers", positions)]).values():
        future.result(timeout=10)
    context = ssl.create_default_context(cafile=str(secure.pki.ca))

    def call(method: str, path: str, body: str | None = None, cookie: str | None = None):
        connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        headers = {"Content-Type": "application/x-www-form-urlencoded"} if body else {}
        if cookie:
            headers["Cookie"] = cookie
        connection.request(method, path, body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.getheader("Set-Cookie"), answer.read().decode()

    # The login page over HTTPS, the broker's certificate checked against its CA.
    status, _, page = call("GET", "/login")
    assert status == 200 and "login-user" in page
    status, cookie, _ = call("POST", "/login", "user=alice&password=alice-secret")
    assert status in (302, 303) and "; Secure" in cookie and "HttpOnly" in cookie, cookie
    session = cookie.split(";")[0]
    status, _, page = call("GET", "/", cookie=session)
    assert status == 200 and "alice" in page
    # The history sampler logged in as the brokers' own user (no credential was made for it).
    deadline = time.monotonic() + 20
    while True:
        status, _, chart = call("GET", "/groups/readers/lag-chart", cookie=session)
        if status == 200 and 'data-points="0"' not in chart and 'data-points="1"' not in chart:
            break
        assert time.monotonic() < deadline, f"no lag history after 20 s: {status} {chart[:500]}"
        time.sleep(0.5)
    # Plain HTTP on the HTTPS port gets no HTTP answer.
    with pytest.raises((urllib.error.URLError, OSError, http.client.HTTPException)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/login", timeout=5)


def test_bench_runs_in_a_folder_are_listed_with_their_table_and_charts(broker_factory, browser, tmp_path):  # noqa: F811
    runs = tmp_path / "runs"
    shutil.copytree(REPO / "bench" / "results" / "latency-10k", runs / "nightly" / "latency-10k")
    port = free_port()
    broker_factory(extra_args=["--console-listen", f"127.0.0.1:{port}", "--console-bench-dir", str(runs)])
    console = f"http://127.0.0.1:{port}"
    browser.get(console + "/")
    browser.find_element(By.ID, "nav-benchmarks").click()
    wait_for_element(browser, "#runs")
    assert texts(browser, "#runs tbody tr") == [
        "nightly/latency-10k Workload: local 10k rate 4p/4c on 1 topic / 100 partitions; driver: local-latency"]
    browser.find_element(By.LINK_TEXT, "nightly/latency-10k").click()
    wait_for_text(browser, "#run-path", "nightly/latency-10k")
    assert "broker CPU s per GiB" in browser.find_element(By.ID, "summary").text
    # Each round's rate and p99 over its 24 samples (the Kafka round first).
    assert chart_values(browser, "#rate-0")[0] == 24 and chart_values(browser, "#rate-1")[1] > 9000
    assert chart_values(browser, "#p99-1")[0] == 24
    shoot(browser, "benchmark")
    # Nothing outside the folder is read.
    for outside in ["../..", "/etc", "nightly"]:
        try:
            urllib.request.urlopen(f"{console}/benchmarks/run?path={urllib.parse.quote(outside)}", timeout=10)
            raise AssertionError(f"{outside} was read")
        except urllib.error.HTTPError as refused:
            assert refused.code == 404


def test_each_user_logs_in_and_sees_only_what_its_acls_allow(broker_factory, browser):  # noqa: F811
    plaintext, sasl, port = free_port(), free_port(), free_port()
    broker = broker_factory(extra_args=[
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{plaintext},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--override", "allow.everyone.if.no.acl.found=false",
        "--override", "super.users=User:admin;User:ANONYMOUS",
        "--override", "sasl.enabled.mechanisms=SCRAM-SHA-256",
        "--console-listen", f"127.0.0.1:{port}"], port=plaintext)
    console = f"http://127.0.0.1:{port}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for user in ["admin", "alice"]:
        add_user(admin, user, f"{user}-secret")
    create_topic(broker.bootstrap, "public", 1)
    create_topic(broker.bootstrap, "secret", 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce("public", value=b"hello")
    producer.produce("secret", value=b"launch codes")
    assert producer.flush(30) == 0
    grants = [AclBinding(ResourceType.TOPIC, "public", ResourcePatternType.LITERAL, "User:alice", "*", operation,
                         AclPermissionType.ALLOW) for operation in (AclOperation.DESCRIBE, AclOperation.READ)]
    for future in admin.create_acls(grants).values():
        future.result(timeout=10)
    vault = [TopicPartition("secret", 0, 0)]
    for future in admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions("vault-readers", vault)]).values():
        future.result(timeout=10)

    def log_in(user: str, password: str) -> None:
        browser.get(console + "/")
        wait_for_element(browser, "#login-user").send_keys(user)
        browser.find_element(By.ID, "login-password").send_keys(password)
        browser.find_element(By.ID, "login-submit").click()

    # Without a session every page sends the browser to log in; a wrong password is refused.
    log_in("alice", "wrong")
    wait_for_text(browser, "#error", "Login failed")
    shoot(browser, "login")
    log_in("alice", "alice-secret")
    wait_for_text(browser, "#user", "alice")
    # alice sees the topic she may describe, and its messages; the other is not listed.
    browser.get(console + "/topics")
    wait_for_element(browser, "#topics")
    assert [row.split()[0] for row in texts(browser, "#topics tbody tr")] == ["public"]
    browser.get(console + "/topics/public/messages")
    wait_for_text(browser, "#messages .count", "1 message(s)")
    assert "hello" in browser.find_element(By.ID, "message-table").text
    # What she may not do the broker refuses, and the page says so.
    browser.get(console + "/topics/public")
    browser.find_element(By.ID, "produce-value").send_keys("from alice")
    browser.find_element(By.ID, "produce").click()
    wait_for_text(browser, "#refused", "TopicAuthorizationFailed")
    browser.get(console + "/topics/secret/messages")
    wait_for_text(browser, "#error", "TopicAuthorizationFailed")
    assert "launch codes" not in browser.page_source
    # Nor do the console's own charts show her what the broker would not: the history of a
    # group or topic she may not describe (sampled as the brokers' user) stays hidden.
    # Nor this node's load, which needs DESCRIBE on the cluster: not on her overview, and
    # its charts' own routes refuse her.
    for path in ["/groups/vault-readers/lag-chart", "/topics/secret/rate-chart", "/node-latency-chart",
                 "/node-traffic-chart"]:
        browser.get(console + path)
        assert "data-points" not in browser.page_source, f"{path}: {browser.page_source[:300]}"
    browser.get(console + "/topics/public/rate-chart")
    assert "data-points" in browser.page_source
    browser.get(console + "/")
    wait_for_element(browser, "#cluster-rate-chart")
    assert not browser.find_elements(By.ID, "node-latency-chart"), "alice sees this node's request latency"
    # Logging out ends the session; admin, a super user, sees both topics.
    browser.get(console + "/")
    browser.find_element(By.CSS_SELECTOR, ".who button").click()
    wait_for_element(browser, "#login-user")
    browser.get(console + "/topics")
    wait_for_element(browser, "#login-user")
    log_in("admin", "admin-secret")
    wait_for_text(browser, "#user", "admin")
    browser.get(console + "/topics")
    wait_for_element(browser, "#topics")
    assert [row.split()[0] for row in texts(browser, "#topics tbody tr")] == ["__consumer_offsets", "public", "secret"]
