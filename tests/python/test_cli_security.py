"""`sluice user`, `sluice acl` and `sluice share` over secured listeners, configured with
librdkafka's `-X` property names: SASL_SSL with SCRAM, SASL_PLAINTEXT, SSL with a client
certificate. New users' passwords come from a file, the environment or standard input, never
the command line; what the tools add is checked with a librdkafka client (confluent-kafka).
"""

import json
import os
import subprocess

import pytest
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramMechanism,
)

from conftest import SLUICE_BIN, free_port
from test_security import add_user, start_secure_broker

ADMIN_PASSWORD = "admin-secret"
AUTHORIZER = ["--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer"]


@pytest.fixture
def secure(broker_factory, tmp_path):
    """The four listeners of test_security, with ACLs enforced and `admin` a SCRAM super user."""
    secure = start_secure_broker(broker_factory, tmp_path, *AUTHORIZER,
                                 "--override", "super.users=User:ANONYMOUS;User:admin")
    add_user(secure.admin(), "admin", ADMIN_PASSWORD, [ScramMechanism.SCRAM_SHA_512])
    return secure


def sasl_ssl(secure, password=ADMIN_PASSWORD) -> list[str]:
    return ["-b", f"127.0.0.1:{secure.sasl_ssl}", "-X", "security.protocol=SASL_SSL",
            "-X", "sasl.mechanism=SCRAM-SHA-512", "-X", "sasl.username=admin", "-X", f"sasl.password={password}",
            "-X", f"ssl.ca.location={secure.pki.ca}"]


def sasl_plaintext(secure) -> list[str]:
    """No sasl.password: it comes from SLUICE_SASL_PASSWORD (see `sluice`)."""
    return ["-b", f"127.0.0.1:{secure.sasl_plaintext}", "-X", "security.protocol=sasl_plaintext",
            "-X", "sasl.mechanism=SCRAM-SHA-512", "-X", "sasl.username=admin"]


def sluice(*args, env=None, stdin="", ok=True) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    environment["SLUICE_SASL_PASSWORD"] = ADMIN_PASSWORD
    environment.update(env or {})
    result = subprocess.run([SLUICE_BIN, *args], capture_output=True, text=True, timeout=60, env=environment,
                            input=stdin)
    if ok:
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return result


def can_authenticate(secure, user: str, password: str) -> bool:
    conf = secure.client("SASL_PLAINTEXT", **{"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
                                              "sasl.password": password})
    try:
        AdminClient(conf).list_topics(timeout=5)
        return True
    except Exception:
        return False


def test_user_add_over_sasl_ssl_from_a_password_file(secure, tmp_path):
    password_file = tmp_path / "bob.password"
    password_file.write_text("bob-secret\n")
    added = sluice("user", *sasl_ssl(secure), "add", "bob", "--password-file", str(password_file))
    assert "added SCRAM-SHA-512 credential for bob" in added.stdout
    assert "bob-secret" not in added.stdout + added.stderr
    # -X after the subcommand works as well.
    listed = [line.split() for line in sluice("user", "list", *sasl_ssl(secure)).stdout.splitlines()]
    assert listed[0] == ["NAME", "MECHANISM", "ITERATIONS"], listed
    assert ["bob", "SCRAM-SHA-512", "8192"] in listed and "admin" in [row[0] for row in listed], listed
    as_json = json.loads(sluice("user", "list", "--format", "json", *sasl_ssl(secure)).stdout)
    assert {"name": "bob", "mechanism": "SCRAM-SHA-512", "iterations": 8192} in as_json

    bob = secure.client("SASL_SSL", **{"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bob",
                                       "sasl.password": "bob-secret"})
    AdminClient(bob).list_topics(timeout=10)
    assert not can_authenticate(secure, "bob", "bob-secret\n")


def test_acl_add_list_remove_over_sasl_plaintext(secure):
    added = sluice("acl", *sasl_plaintext(secure), "add", "--allow", "--principal", "User:bob",
                   "--operation", "read", "--operation", "describe", "--topic", "orders")
    assert added.stdout == "added 2 ACLs on TOPIC orders\n"
    listed = [line.split() for line in sluice("acl", *sasl_plaintext(secure), "list", "--topic", "orders").stdout
              .splitlines()]
    assert listed == [["PRINCIPAL", "HOST", "RESOURCE-TYPE", "RESOURCE-NAME", "PATTERN", "OPERATION", "PERMISSION"],
                      ["User:bob", "*", "TOPIC", "orders", "LITERAL", "READ", "ALLOW"],
                      ["User:bob", "*", "TOPIC", "orders", "LITERAL", "DESCRIBE", "ALLOW"]], listed
    # The same ACLs, seen by a librdkafka admin client.
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                  AclPermissionType.ANY)
    admin = secure.admin()
    bindings = admin.describe_acls(everything).result(timeout=10)
    assert sorted(b.operation.name for b in bindings if b.principal == "User:bob") == ["DESCRIBE", "READ"]
    sluice("acl", *sasl_plaintext(secure), "remove", "--topic", "orders")
    assert "User:bob" not in sluice("acl", *sasl_plaintext(secure), "list").stdout


def test_wrong_password_is_a_clear_authentication_error(secure):
    result = sluice("user", *sasl_ssl(secure, password="not-the-password"), "list", ok=False)
    assert result.returncode != 0
    expected = f"authentication to 127.0.0.1:{secure.sasl_ssl} as admin (SCRAM-SHA-512) failed"
    assert expected in result.stderr and "Authentication failed" in result.stderr, result.stderr
    assert "{" not in result.stderr and "admin-secret" not in result.stderr, result.stderr


def test_connection_and_tls_failures_name_the_address_and_the_reason(secure):
    closed = free_port()
    refused = sluice("acl", "-b", f"127.0.0.1:{closed}", "list", ok=False)
    assert refused.returncode != 0, refused.stdout
    assert refused.stderr == f"error: cannot reach 127.0.0.1:{closed}: connection refused\n", refused.stderr
    untrusted = sluice("user", *sasl_ssl(secure), "-X", f"ssl.ca.location={secure.pki.other_ca}", "list", ok=False)
    assert untrusted.returncode != 0
    assert f"TLS handshake with 127.0.0.1:{secure.sasl_ssl} failed" in untrusted.stderr, untrusted.stderr
    assert "UnknownIssuer" in untrusted.stderr, untrusted.stderr
    unknown = sluice("user", "-X", "sasl.mechanisms=PLAIN", "list", ok=False)
    assert unknown.returncode != 0
    assert "unknown setting; known: security.protocol, ssl.ca.location" in unknown.stderr, unknown.stderr
    no_password = sluice("user", *sasl_plaintext(secure), "list", env={"SLUICE_SASL_PASSWORD": ""}, ok=False)
    assert "no password for sasl.username admin: set SLUICE_SASL_PASSWORD" in no_password.stderr


def test_new_password_from_the_environment_and_from_stdin(secure):
    sluice("user", *sasl_plaintext(secure), "add", "carol", env={"SLUICE_USER_PASSWORD": "carol-secret"})
    sluice("user", *sasl_plaintext(secure), "add", "dave", stdin="dave-secret\n")
    assert can_authenticate(secure, "carol", "carol-secret")
    assert can_authenticate(secure, "dave", "dave-secret")
    empty = sluice("user", *sasl_plaintext(secure), "add", "erin", stdin="", ok=False)
    assert empty.returncode != 0 and "the password of erin is empty" in empty.stderr, empty.stderr


def test_password_on_the_command_line_still_works_with_a_warning(secure):
    result = sluice("user", *sasl_plaintext(secure), "add", "frank", "--password", "frank-secret")
    assert "--password is visible to other users" in result.stderr
    assert can_authenticate(secure, "frank", "frank-secret")


def test_share_list_over_sasl_ssl(secure):
    assert sluice("share", *sasl_ssl(secure), "list").stdout == "GROUP  STATE\n"
    assert sluice("share", *sasl_ssl(secure), "list", "--format", "json").stdout == "[]\n"


def test_client_certificate_over_ssl(broker_factory, tmp_path):
    secure = start_secure_broker(
        broker_factory, tmp_path, "--override", "ssl.client.auth=required",
        "--override", f"ssl.truststore.location={tmp_path / 'pki' / 'ca.pem'}",
        *AUTHORIZER, "--override", "super.users=User:CN=sluice-test-client",
    )
    ssl = ["-b", f"127.0.0.1:{secure.ssl}", "-X", "security.protocol=SSL", "-X", f"ssl.ca.location={secure.pki.ca}"]
    with_certificate = [*ssl, "-X", f"ssl.certificate.location={secure.pki.client_cert}",
                        "-X", f"ssl.key.location={secure.pki.client_key}"]
    sluice("acl", *with_certificate, "add", "--allow", "--principal", "User:bob", "--operation", "read",
           "--topic", "mtls")
    assert "User:bob   *     TOPIC          mtls           LITERAL  READ       ALLOW" in \
        sluice("acl", *with_certificate, "list").stdout
    # Without a certificate the broker ends the handshake.
    refused = sluice("acl", *ssl, "list", ok=False)
    assert refused.returncode != 0 and f"127.0.0.1:{secure.ssl}" in refused.stderr, refused.stderr
    # Verification off: no CA needed, the client certificate still names the principal.
    unverified = ["-b", f"127.0.0.1:{secure.ssl}", "-X", "security.protocol=ssl",
                  "-X", "enable.ssl.certificate.verification=false",
                  "-X", f"ssl.certificate.location={secure.pki.client_cert}",
                  "-X", f"ssl.key.location={secure.pki.client_key}"]
    assert ["User:bob", "*", "TOPIC", "mtls", "LITERAL", "READ", "ALLOW"] in \
        [line.split() for line in sluice("acl", *unverified, "list").stdout.splitlines()]
