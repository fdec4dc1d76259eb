"""The web console (`--console-listen`), driven in a real headless Chromium: the overview, the
topics list and its filter, a topic's partitions and configs, its messages (newest, from an
offset, one partition, filtered; keys, values and headers shown as text, JSON, hex, null or
empty), a consumer group's members, assignment and lag, on a laptop-size and a phone-size
screen. With SASL users, visitors log in as Kafka clients do and each sees only what its ACLs
allow."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic,
                                   ResourcePatternType, ResourceType)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from browser_support import browser, phone_size, screenshot, wait_for_element, wait_for_text  # noqa: F401
from conftest import free_port
from test_security import add_user

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
