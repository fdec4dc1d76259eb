"""The web console's Security pages (`/security/users`, `/security/acls`, `/security/quotas`),
driven in a real headless Chromium against a SASL broker with an authorizer: a super user adds
a SCRAM user who then logs in with it, grants that user a topic and takes it back, sets and
removes a client quota; what the broker then holds is checked with a librdkafka admin client.
A user without rights on the cluster sees the broker's refusal on each page, and bad form
input is answered with what is wrong with it."""

from __future__ import annotations

from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType, ScramMechanism)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from browser_support import browser, wait_for_element, wait_for_text  # noqa: F401
from conftest import free_port
from test_console import create_topic, shoot, texts
from test_security import add_user

EVERY_ACL = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                             AclPermissionType.ANY)


def start_console(broker_factory) -> tuple[str, AdminClient]:
    """A broker with SCRAM users, an authorizer that denies what no ACL allows, admin as a
    super user, and a console; the console's address and a super user's admin client."""
    plaintext, sasl, port = free_port(), free_port(), free_port()
    broker = broker_factory(extra_args=[
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{plaintext},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--override", "allow.everyone.if.no.acl.found=false",
        "--override", "super.users=User:admin;User:ANONYMOUS",
        "--override", "sasl.enabled.mechanisms=SCRAM-SHA-256",
        "--console-listen", f"127.0.0.1:{port}"], port=plaintext)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    add_user(admin, "admin", "admin-secret")
    create_topic(broker.bootstrap, "orders", 1)
    return f"http://127.0.0.1:{port}", admin


def log_in(driver, console: str, user: str, password: str) -> None:
    driver.get(console + "/login")
    wait_for_element(driver, "#login-user").send_keys(user)
    driver.find_element(By.ID, "login-password").send_keys(password)
    driver.find_element(By.ID, "login-submit").click()
    wait_for_text(driver, "#user", user)


def log_out(driver, console: str) -> None:
    driver.get(console + "/")
    driver.find_element(By.CSS_SELECTOR, ".who button").click()
    wait_for_element(driver, "#login-user")


def fill(driver, fields: dict[str, str]) -> None:
    """Types into inputs and picks in selects, by element id."""
    for element_id, value in fields.items():
        element = driver.find_element(By.ID, element_id)
        if element.tag_name == "select":
            Select(element).select_by_value(value)
        else:
            element.clear()
            element.send_keys(value)


def rows(driver, table: str) -> list[list[str]]:
    """The words of each row of a table (empty cells leave none)."""
    return [row.split() for row in texts(driver, f"{table} tbody tr")]


def visible_topics(driver, console: str) -> list[str]:
    driver.get(console + "/topics")
    wait_for_element(driver, "#topics")
    return [row.split()[0] for row in texts(driver, "#topics tbody tr")]


def test_admin_adds_a_user_who_logs_in_and_grants_it_a_topic(broker_factory, browser):  # noqa: F811
    console, admin = start_console(broker_factory)
    log_in(browser, console, "admin", "admin-secret")
    browser.find_element(By.ID, "nav-security").click()
    wait_for_element(browser, "#users")

    # A new user: listed with its mechanism, the password nowhere in the page.
    fill(browser, {"new-user": "bob", "new-password": "bob-Secret-42", "new-mechanism": "SCRAM-SHA-256"})
    browser.find_element(By.ID, "set-password").click()
    wait_for_text(browser, "#done", "SCRAM-SHA-256 password set for bob")
    assert rows(browser, "#users") == [["admin", "SCRAM-SHA-256", "4096", "Delete"],
                                       ["bob", "SCRAM-SHA-256", "4096", "Delete"]]
    assert "bob-Secret-42" not in browser.page_source
    shoot(browser, "users")
    described = admin.describe_user_scram_credentials(["bob"])["bob"].result(timeout=10)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == \
        [(ScramMechanism.SCRAM_SHA_256, 4096)]

    # The credential works: bob logs in, and sees no topic yet.
    log_out(browser, console)
    log_in(browser, console, "bob", "bob-Secret-42")
    assert visible_topics(browser, console) == []
    log_out(browser, console)

    # admin grants bob READ on orders; the broker has the binding and bob sees the topic.
    log_in(browser, console, "admin", "admin-secret")
    browser.get(console + "/security/acls")
    fill(browser, {"acl-principal": "User:bob", "acl-permission": "ALLOW", "acl-operation": "READ",
                   "acl-resource-type": "TOPIC", "acl-pattern-type": "LITERAL", "acl-resource-name": "orders"})
    browser.find_element(By.ID, "add-acl").click()
    wait_for_text(browser, "#done", "added: ALLOW User:bob from * READ on TOPIC LITERAL orders")
    assert rows(browser, "#acls") == [["User:bob", "*", "READ", "ALLOW", "TOPIC", "LITERAL", "orders", "Remove"]]
    shoot(browser, "acls")
    bindings = admin.describe_acls(EVERY_ACL).result(timeout=10)
    assert [(b.principal, b.operation, b.name) for b in bindings] == [("User:bob", AclOperation.READ, "orders")]
    log_out(browser, console)
    log_in(browser, console, "bob", "bob-Secret-42")
    assert visible_topics(browser, console) == ["orders"]
    log_out(browser, console)

    # The filter narrows the table; the row's button removes exactly that binding.
    log_in(browser, console, "admin", "admin-secret")
    browser.get(console + "/security/acls?principal=alice")
    wait_for_text(browser, ".count", "0 binding(s)")
    browser.get(console + "/security/acls?principal=bob&resource=ord")
    wait_for_text(browser, ".count", "1 binding(s)")
    browser.find_element(By.CSS_SELECTOR, "#acls .remove-acl button").click()
    wait_for_text(browser, "#done", "removed: ALLOW User:bob from * READ on TOPIC LITERAL orders")
    assert admin.describe_acls(EVERY_ACL).result(timeout=10) == []

    # Deleting a credential takes its name typed again.
    browser.get(console + "/security/users")
    bob_row = wait_for_text(browser, "#users tbody tr", "bob")
    bob_row.find_element(By.CSS_SELECTOR, "button").click()
    wait_for_text(browser, "#refused", "type the user's name (bob) to confirm")
    bob_row = wait_for_text(browser, "#users tbody tr", "bob")
    bob_row.find_element(By.CSS_SELECTOR, "input[name=confirm]").send_keys("bob")
    bob_row.find_element(By.CSS_SELECTOR, "button").click()
    wait_for_text(browser, "#done", "SCRAM-SHA-256 credential of bob deleted")
    assert [row[0] for row in rows(browser, "#users")] == ["admin"]


def test_admin_sets_and_removes_a_client_quota(broker_factory, browser):  # noqa: F811
    console, admin = start_console(broker_factory)
    log_in(browser, console, "admin", "admin-secret")
    browser.get(console + "/security/quotas")
    wait_for_text(browser, ".count", "Entities with quotas: 0")

    fill(browser, {"quota-client-match": "named", "quota-client-id": "loader", "quota-key": "producer_byte_rate",
                   "quota-value": "1048576"})
    browser.find_element(By.ID, "set-quota").click()
    wait_for_text(browser, "#done", "producer_byte_rate = 1048576 for client-id loader")
    assert rows(browser, "#quotas") == [["client-id", "loader", "1048576", "Remove"]]
    fill(browser, {"quota-user-match": "default", "quota-key": "consumer_byte_rate", "quota-value": "2000"})
    browser.find_element(By.ID, "set-quota").click()
    wait_for_text(browser, "#done", "consumer_byte_rate = 2000 for user (default)")
    assert rows(browser, "#quotas") == [["client-id", "loader", "1048576", "Remove"],
                                        ["user", "(default)", "2000", "Remove"]]
    shoot(browser, "quotas")

    # Bad input is refused by the console with what is wrong; the broker's own refusal shown as is.
    fill(browser, {"quota-client-match": "named", "quota-client-id": "loader", "quota-value": "fast"})
    browser.find_element(By.ID, "set-quota").click()
    wait_for_text(browser, "#refused", "the producer_byte_rate value \"fast\" is not a number")
    fill(browser, {"quota-key": "controller_mutation_rate", "quota-value": "5"})
    browser.find_element(By.ID, "set-quota").click()
    wait_for_text(browser, "#refused", "InvalidRequest")

    wait_for_text(browser, "#quotas tbody tr", "client-id loader").find_element(By.CSS_SELECTOR, "button").click()
    wait_for_text(browser, "#done", "quotas of client-id loader removed")
    assert rows(browser, "#quotas") == [["user", "(default)", "2000", "Remove"]]


def test_a_user_without_cluster_rights_sees_the_refusals_and_bad_input_is_named(broker_factory, browser):  # noqa: F811
    console, admin = start_console(broker_factory)
    add_user(admin, "carol", "carol-secret")
    log_in(browser, console, "carol", "carol-secret")
    for page in ("users", "acls", "quotas"):
        browser.get(f"{console}/security/{page}")
        wait_for_text(browser, "#listing-refused", "ClusterAuthorizationFailed")
    shoot(browser, "quotas-refused")
    fill(browser, {"quota-client-match": "named", "quota-client-id": "x", "quota-value": "10"})
    browser.find_element(By.ID, "set-quota").click()
    wait_for_text(browser, "#refused", "ClusterAuthorizationFailed")
    browser.get(console + "/security/users")
    fill(browser, {"new-user": "mallory", "new-password": "pw-mallory"})
    browser.find_element(By.ID, "set-password").click()
    wait_for_text(browser, "#refused", "ClusterAuthorizationFailed")
    assert "pw-mallory" not in browser.page_source
    log_out(browser, console)

    # Input the console cannot send is named before any request (the browser's own checks
    # off, as a hand-made request would have them).
    log_in(browser, console, "admin", "admin-secret")
    browser.get(console + "/security/users")
    browser.execute_script("document.getElementById('user-form').noValidate = true;"
                           "document.querySelector('#new-mechanism option').value = 'SCRAM-SHA-1';")
    fill(browser, {"new-user": "dave", "new-password": "pw"})
    browser.find_element(By.ID, "set-password").click()
    wait_for_text(browser, "#refused", "unknown mechanism \"SCRAM-SHA-1\"")
    browser.execute_script("document.getElementById('user-form').noValidate = true;")
    fill(browser, {"new-password": "pw"})
    browser.find_element(By.ID, "set-password").click()
    wait_for_text(browser, "#refused", "the user name is empty")
    browser.get(console + "/security/acls")
    fill(browser, {"acl-principal": "bob", "acl-resource-name": "orders"})
    browser.find_element(By.ID, "add-acl").click()
    wait_for_text(browser, "#refused", "is not TYPE:NAME")
    fill(browser, {"acl-principal": "User:bob", "acl-resource-type": "CLUSTER", "acl-resource-name": "orders"})
    browser.find_element(By.ID, "add-acl").click()
    wait_for_text(browser, "#refused", "InvalidRequest")
