"""The Schema Registry served by the broker (`--schema-registry-listen`), driven by
confluent-kafka's own registry client and serializers: Avro, JSON Schema and Protobuf payloads go
through Sluice's registry and topics and come back decoded; schema evolution is accepted or
refused exactly as each compatibility level says; ids survive kill -9 and are never given
twice; Protobuf schemas registered as descriptors or as .proto text; bad input gets the
registry's error codes; with SASL users, HTTP basic auth is
required and checked against their SCRAM credentials."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import ScramMechanism
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from conftest import free_port
from test_security import add_user, start_secure_broker

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

USER_V1 = {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}]}


def avro(fields: list[dict]) -> str:
    return json.dumps({"type": "record", "name": "User", "fields": fields})


class Registry:
    """A broker serving the registry, and its URL."""

    def __init__(self, broker, port: int):
        self.broker = broker
        self.url = f"http://127.0.0.1:{port}"

    def client(self, **conf) -> SchemaRegistryClient:
        return SchemaRegistryClient({"url": self.url, **conf})

    def call(self, method: str, path: str, body=None, content_type=CONTENT_TYPE, raw: bytes | None = None,
             auth: str | None = None) -> tuple[int, object]:
        """(HTTP status, decoded JSON body) of one request."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None and content_type:
            request.add_header("Content-Type", content_type)
        if auth:
            request.add_header("Authorization", auth)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")


@pytest.fixture
def registry(broker_factory) -> Registry:
    port = free_port()
    broker = broker_factory(extra_args=["--schema-registry-listen", f"127.0.0.1:{port}"])
    return Registry(broker, port)


def round_trip(registry: Registry, topic: str, serializer, deserializer, values: list) -> list:
    """Produces `values` serialized to `topic` and consumes them back deserialized."""
    producer = Producer({"bootstrap.servers": registry.broker.bootstrap})
    for value in values:
        producer.produce(topic, serializer(value, SerializationContext(topic, MessageField.VALUE)))
    assert producer.flush(10) == 0
    consumer = Consumer({"bootstrap.servers": registry.broker.bootstrap, "group.id": f"{topic}-reader",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    read = []
    try:
        while len(read) < len(values):
            message = consumer.poll(10)
            assert message is not None, f"read only {read}"
            assert message.error() is None, message.error()
            read.append(deserializer(message.value(), SerializationContext(topic, MessageField.VALUE)))
    finally:
        consumer.close()
    return read


def test_avro_serializer_and_deserializer_round_trip_through_the_registry(registry):
    client = registry.client()
    serializer = AvroSerializer(client, json.dumps(USER_V1))
    values = [{"name": f"user-{i}"} for i in range(20)]
    assert round_trip(registry, "users", serializer, AvroDeserializer(client), values) == values
    latest = client.get_latest_version("users-value")
    assert latest.version == 1 and latest.schema.schema_type == "AVRO"
    assert json.loads(client.get_schema(latest.schema_id).schema_str) == USER_V1
    # The same schema registered again, and under another subject, keeps its id.
    assert client.register_schema("users-value", Schema(json.dumps(USER_V1), "AVRO")) == latest.schema_id
    assert client.register_schema("other-value", Schema(json.dumps(USER_V1), "AVRO")) == latest.schema_id
    assert sorted(client.get_subjects()) == ["other-value", "users-value"]


def test_json_schema_serializer_round_trip_through_the_registry(registry):
    client = registry.client()
    schema = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}, "tag": {"type": "string"}},
                         "required": ["id"]})
    values = [{"id": i, "tag": "t"} for i in range(10)]
    read = round_trip(registry, "events", JSONSerializer(schema, client),
                      JSONDeserializer(schema, schema_registry_client=client), values)
    assert read == values
    latest = client.get_latest_version("events-value")
    assert latest.schema.schema_type == "JSON"
    # The serializer validates against the registered schema: a document it refuses.
    with pytest.raises(Exception):
        JSONSerializer(schema, client)({"tag": "no id"}, SerializationContext("events", MessageField.VALUE))


def order_message_class():
    """A Protobuf message class built from a descriptor at run time (no protoc here): what
    generated code would give confluent-kafka's ProtobufSerializer."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="order.proto", package="shop", syntax="proto3")
    order = file.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    order.field.add(name="item", number=2, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def test_protobuf_imports_are_registered_as_references(registry):
    """A message whose .proto file imports another: the serializer registers the imported
    file under its own subject first, then the message's schema with a reference to it."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    field = descriptor_pb2.FieldDescriptorProto
    common = descriptor_pb2.FileDescriptorProto(name="shop/money.proto", package="shop", syntax="proto3")
    money = common.message_type.add(name="Money")
    money.field.add(name="cents", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    money.field.add(name="currency", number=2, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    file = descriptor_pb2.FileDescriptorProto(name="shop/payment.proto", package="shop", syntax="proto3",
                                              dependency=["shop/money.proto"])
    payment = file.message_type.add(name="Payment")
    payment.field.add(name="id", number=1, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    payment.field.add(name="amount", number=2, type=field.TYPE_MESSAGE, type_name=".shop.Money",
                      label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(common)
    pool.Add(file)
    payment_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Payment"))
    client = registry.client()
    conf = {"use.deprecated.format": False}
    values = [payment_class(id=i, amount={"cents": 100 * i, "currency": "EUR"}) for i in range(5)]
    read = round_trip(registry, "payments", ProtobufSerializer(payment_class, client, conf),
                      ProtobufDeserializer(payment_class, conf, client), values)
    assert read == values
    latest = client.get_latest_version("payments-value")
    assert [(r.name, r.subject) for r in latest.schema.references] == [("shop/money.proto", "shop/money.proto")]
    referenced = client.get_latest_version("shop/money.proto")
    assert registry.call("GET", f"/subjects/shop%2Fmoney.proto/versions/{referenced.version}/referencedby")[1] == \
        [latest.schema_id]
    # The imported file cannot be deleted while the message's schema refers to it.
    status, body = registry.call("DELETE", f"/subjects/shop%2Fmoney.proto/versions/{referenced.version}")
    assert (status, body["error_code"]) == (422, 42206), body


def test_protobuf_serializer_round_trip_and_proto_text(registry):
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
    order = order_message_class()
    client = registry.client()
    conf = {"use.deprecated.format": False}
    values = [order(id=i, item=f"item-{i}") for i in range(10)]
    read = round_trip(registry, "orders", ProtobufSerializer(order, client, conf),
                      ProtobufDeserializer(order, conf, client), values)
    assert read == values
    assert client.get_latest_version("orders-value").schema.schema_type == "PROTOBUF"
    # The same schema as .proto text, from a tool that writes text: registered, and served back
    # as a descriptor to a client that asks for the serialized form.
    text = 'syntax = "proto3";\npackage shop;\nmessage Event {\n  int64 id = 1;\n  string kind = 2;\n}\n'
    status, body = registry.call("POST", "/subjects/events-value/versions", {"schema": text, "schemaType": "PROTOBUF"})
    assert status == 200, body
    status, answer = registry.call("GET", f"/schemas/ids/{body['id']}?format=serialized")
    from google.protobuf import descriptor_pb2
    descriptor = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(answer["schema"]))
    assert [m.name for m in descriptor.message_type] == ["Event"] and answer["schemaType"] == "PROTOBUF"
    assert registry.call("GET", f"/schemas/ids/{body['id']}")[1]["schema"] == text
    # A field number that changes kind is refused; one that is added is accepted.
    retyped = text.replace("string kind = 2", "int32 kind = 2")
    status, refused = registry.call("POST", "/subjects/events-value/versions", {"schema": retyped, "schemaType": "PROTOBUF"})
    assert (status, refused["error_code"]) == (409, 409), refused
    added = text.replace("string kind = 2;", "string kind = 2;\n  int32 count = 3;")
    assert registry.call("POST", "/subjects/events-value/versions", {"schema": added, "schemaType": "PROTOBUF"})[0] == 200
    status, invalid = registry.call("POST", "/subjects/x-value/versions", {"schema": "message M { int32 a = ; }",
                                                                          "schemaType": "PROTOBUF"})
    assert (status, invalid["error_code"]) == (422, 42201)


NAME = {"name": "name", "type": "string"}
AGE_DEFAULT = {"name": "age", "type": "int", "default": 0}
AGE = {"name": "age", "type": "int"}
NAME_DEFAULT = {"name": "name", "type": "string", "default": ""}
NAME_INT_DEFAULT = {"name": "name", "type": "int", "default": 0}

# (level, versions registered first, the new version, accepted?) as Confluent's documentation
# of each level says: adding a field with a default is compatible every way; adding one without
# a default breaks BACKWARD (new readers cannot read old data); deleting a field without a
# default breaks FORWARD (old readers need it); transitive levels check every earlier version.
EVOLUTIONS = {
    "backward-add-with-default": ("BACKWARD", [[NAME]], [NAME, AGE_DEFAULT], True),
    "backward-add-without-default": ("BACKWARD", [[NAME]], [NAME, AGE], False),
    "backward-delete-field": ("BACKWARD", [[NAME, AGE]], [NAME], True),
    "forward-add-without-default": ("FORWARD", [[NAME]], [NAME, AGE], True),
    "forward-delete-field-without-default": ("FORWARD", [[NAME, AGE]], [NAME], False),
    "forward-delete-field-with-default": ("FORWARD", [[NAME, AGE_DEFAULT]], [NAME], True),
    "full-add-with-default": ("FULL", [[NAME]], [NAME, AGE_DEFAULT], True),
    "full-add-without-default": ("FULL", [[NAME]], [NAME, AGE], False),
    "full-delete-field-without-default": ("FULL", [[NAME, AGE]], [NAME], False),
    "none-anything": ("NONE", [[NAME]], [{"name": "other", "type": "long"}], True),
    # Each transitive case is accepted by its non-transitive level: the new version is
    # compatible with the latest one and not with an older one.
    "backward-transitive-checks-every-version": ("BACKWARD_TRANSITIVE", [[NAME], [AGE_DEFAULT]], [AGE_DEFAULT, NAME_INT_DEFAULT], False),
    "backward-checks-the-latest-only": ("BACKWARD", [[NAME], [AGE_DEFAULT]], [AGE_DEFAULT, NAME_INT_DEFAULT], True),
    "forward-transitive-checks-every-version": ("FORWARD_TRANSITIVE", [[NAME, AGE], [NAME, AGE_DEFAULT]], [NAME], False),
    "forward-checks-the-latest-only": ("FORWARD", [[NAME, AGE], [NAME, AGE_DEFAULT]], [NAME], True),
    "full-transitive-checks-every-version": ("FULL_TRANSITIVE", [[NAME_DEFAULT], [AGE_DEFAULT]], [AGE_DEFAULT, NAME_INT_DEFAULT], False),
    "full-checks-the-latest-only": ("FULL", [[NAME_DEFAULT], [AGE_DEFAULT]], [AGE_DEFAULT, NAME_INT_DEFAULT], True),
}


@pytest.mark.parametrize("case", sorted(EVOLUTIONS))
def test_schema_evolution_follows_the_compatibility_level(registry, case):
    level, earlier, new, accepted = EVOLUTIONS[case]
    client = registry.client()
    subject = f"{case}-value"
    client.set_compatibility(subject, level)
    previous = client.get_compatibility()
    for fields in earlier:
        client.register_schema(subject, Schema(avro(fields), "AVRO"))
    tested = client.test_compatibility_all_versions(subject, Schema(avro(new), "AVRO"))
    assert tested is accepted, f"{case}: the compatibility check said {tested}"
    # Against the latest version alone, every case but the transitive ones decides the same.
    against_latest = client.test_compatibility(subject, Schema(avro(new), "AVRO"))
    assert against_latest is (accepted or "transitive" in case), f"{case}: against the latest: {against_latest}"
    if accepted:
        client.register_schema(subject, Schema(avro(new), "AVRO"))
        assert client.get_latest_version(subject).version == len(earlier) + 1
    else:
        with pytest.raises(SchemaRegistryError) as refused:
            client.register_schema(subject, Schema(avro(new), "AVRO"))
        assert refused.value.http_status_code == 409 and refused.value.error_code == 409
        assert client.get_latest_version(subject).version == len(earlier)
    assert client.get_compatibility() == previous == "BACKWARD", "a subject's level left the default alone"


def test_ids_survive_kill_9_and_are_never_given_twice(registry):
    client = registry.client()
    first = client.register_schema("a-value", Schema(avro([NAME]), "AVRO"))
    second = client.register_schema("b-value", Schema(avro([AGE]), "AVRO"))
    assert second > first
    registry.broker.kill()
    registry.broker.start()
    client = registry.client()
    assert json.loads(client.get_schema(second).schema_str)["fields"] == [AGE]
    # Hard-delete every schema: the next one still gets a new id, also after a restart.
    for subject in ("a-value", "b-value"):
        client.delete_subject(subject)
        client.delete_subject(subject, permanent=True)
    assert client.get_subjects() == []
    registry.broker.kill()
    registry.broker.start()
    third = registry.client().register_schema("c-value", Schema(avro([NAME, AGE_DEFAULT]), "AVRO"))
    assert third > second
    status, body = registry.call("GET", f"/schemas/ids/{second}")
    assert (status, body["error_code"]) == (404, 40403)


def test_soft_and_hard_deletes_modes_and_lookups(registry):
    client = registry.client()
    v1 = client.register_schema("s-value", Schema(avro([NAME]), "AVRO"))
    client.register_schema("s-value", Schema(avro([NAME, AGE_DEFAULT]), "AVRO"))
    found = client.lookup_schema("s-value", Schema(avro([NAME]), "AVRO"))
    assert (found.schema_id, found.version) == (v1, 1)
    assert registry.call("DELETE", "/subjects/s-value/versions/1") == (200, 1)
    assert registry.call("GET", "/subjects/s-value/versions") == (200, [2])
    assert registry.call("GET", "/subjects/s-value/versions?deleted=true") == (200, [1, 2])
    # Permanent deletion needs a soft deletion first.
    status, body = registry.call("DELETE", "/subjects/s-value/versions/2?permanent=true")
    assert (status, body["error_code"]) == (404, 40407)
    assert registry.call("DELETE", "/subjects/s-value") == (200, [2])
    status, body = registry.call("GET", "/subjects/s-value/versions")
    assert (status, body["error_code"]) == (404, 40401)
    assert registry.call("DELETE", "/subjects/s-value?permanent=true") == (200, [1, 2])
    # The registry's mode: READONLY refuses writes, READWRITE accepts them again.
    assert registry.call("PUT", "/mode", {"mode": "READONLY"}) == (200, {"mode": "READONLY"})
    status, body = registry.call("POST", "/subjects/t-value/versions", {"schema": avro([NAME])})
    assert (status, body["error_code"]) == (422, 42205)
    assert registry.call("PUT", "/mode", {"mode": "READWRITE"}) == (200, {"mode": "READWRITE"})
    assert registry.call("POST", "/subjects/t-value/versions", {"schema": avro([NAME])})[0] == 200
    # IMPORT mode keeps the given id and version.
    assert registry.call("PUT", "/mode/imported-value", {"mode": "IMPORT"})[0] == 200
    imported = {"schema": avro([AGE]), "id": 1000, "version": 7}
    assert registry.call("POST", "/subjects/imported-value/versions", imported) == (200, {"id": 1000})
    status, body = registry.call("GET", "/subjects/imported-value/versions/latest")
    assert (body["id"], body["version"]) == (1000, 7)
    assert registry.call("GET", "/schemas/types")[1] == ["JSON", "PROTOBUF", "AVRO"]


def test_bad_input_gets_the_registrys_error_codes(registry):
    registry.client().register_schema("s-value", Schema(avro([NAME]), "AVRO"))
    cases = [
        ("invalid Avro", "POST", "/subjects/x-value/versions", {"schema": '{"type":"recrd"}'}, 422, 42201),
        ("schema not JSON", "POST", "/subjects/x-value/versions", {"schema": "{"}, 422, 42201),
        ("unknown type", "POST", "/subjects/x-value/versions", {"schema": "{}", "schemaType": "XML"}, 422, 42201),
        ("missing reference", "POST", "/subjects/x-value/versions",
         {"schema": avro([NAME]), "references": [{"name": "A", "subject": "nope", "version": 1}]}, 422, 42201),
        ("unknown subject", "GET", "/subjects/nope/versions", None, 404, 40401),
        ("unknown version", "GET", "/subjects/s-value/versions/9", None, 404, 40402),
        ("invalid version", "GET", "/subjects/s-value/versions/zero", None, 422, 42202),
        ("unknown id", "GET", "/schemas/ids/424242", None, 404, 40403),
        ("unknown subject config", "GET", "/config/s-value", None, 404, 40408),
        ("invalid level", "PUT", "/config", {"compatibility": "SIDEWAYS"}, 422, 42203),
        ("invalid mode", "PUT", "/mode", {"mode": "WRITEONLY"}, 422, 42204),
        ("lookup of an unregistered schema", "POST", "/subjects/s-value", {"schema": avro([AGE])}, 404, 40403),
    ]
    for what, method, path, body, status, code in cases:
        got_status, got = registry.call(method, path, body)
        assert (got_status, got["error_code"]) == (status, code), f"{what}: {got_status} {got}"
        assert got["message"], what
    status, body = registry.call("POST", "/subjects/x-value/versions", raw=b'{"schema":', content_type=CONTENT_TYPE)
    assert (status, body["error_code"]) == (422, 422)
    status, body = registry.call("POST", "/subjects/x-value/versions", {"schema": avro([NAME])},
                                 content_type="text/plain")
    assert (status, body["error_code"]) == (415, 415)
    huge = json.dumps({"schema": json.dumps({"type": "string", "doc": "x" * (17 * 1024 * 1024)})}).encode()
    status, body = registry.call("POST", "/subjects/x-value/versions", raw=huge)
    assert (status, body["error_code"]) == (413, 413)
    # Nothing of the refused requests was registered; the broker still serves.
    assert registry.client().get_subjects() == ["s-value"]


def test_basic_auth_against_the_sasl_users(broker_factory, tmp_path):
    port = free_port()
    secure = start_secure_broker(broker_factory, tmp_path, "--schema-registry-listen", f"127.0.0.1:{port}")
    add_user(secure.admin(), "alice", "alice-secret", [ScramMechanism.SCRAM_SHA_256])
    registry = Registry(secure, port)
    status, body = registry.call("GET", "/subjects")
    assert (status, body["error_code"]) == (401, 401)
    wrong = "Basic " + base64.b64encode(b"alice:wrong").decode()
    status, body = registry.call("GET", "/subjects", auth=wrong)
    assert (status, body["error_code"]) == (401, 401)
    unknown = "Basic " + base64.b64encode(b"mallory:alice-secret").decode()
    assert registry.call("GET", "/subjects", auth=unknown)[0] == 401
    client = registry.client(**{"basic.auth.user.info": "alice:alice-secret"})
    schema_id = client.register_schema("s-value", Schema(avro([NAME]), "AVRO"))
    assert client.get_schema(schema_id).schema_type == "AVRO"
    with pytest.raises(SchemaRegistryError) as refused:
        registry.client(**{"basic.auth.user.info": "alice:wrong"}).get_subjects()
    assert refused.value.http_status_code == 401


def test_acls_decide_who_reads_registers_and_configures_each_subject(broker_factory):
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient, ResourcePatternType,
                                       ResourceType)
    plaintext, sasl, port = free_port(), free_port(), free_port()
    broker = broker_factory(extra_args=[
        "--override", f"listeners=PLAINTEXT://127.0.0.1:{plaintext},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--override", "allow.everyone.if.no.acl.found=false",
        "--override", "super.users=User:admin;User:ANONYMOUS",
        "--override", "sasl.enabled.mechanisms=SCRAM-SHA-256",
        "--schema-registry-listen", f"127.0.0.1:{port}"], port=plaintext)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for user in ["admin", "alice", "bob"]:
        add_user(admin, user, f"{user}-secret")

    def allow(principal, name, operation, pattern=ResourcePatternType.LITERAL, resource=ResourceType.TOPIC):
        binding = AclBinding(resource, name, pattern, principal, "*", operation, AclPermissionType.ALLOW)
        for future in admin.create_acls([binding]).values():
            future.result(timeout=10)

    # alice produces to `orders` and everything under `shared-`; bob only consumes `orders`.
    allow("User:alice", "orders", AclOperation.WRITE)
    allow("User:alice", "shared-", AclOperation.WRITE, ResourcePatternType.PREFIXED)
    allow("User:bob", "orders", AclOperation.READ)
    registry = Registry(broker, port)

    def as_user(user):
        return registry.client(**{"basic.auth.user.info": f"{user}:{user}-secret"})

    def refused(call):
        with pytest.raises(SchemaRegistryError) as error:
            call()
        return error.value.http_status_code, error.value.error_code

    alice, bob, admin_client = as_user("alice"), as_user("bob"), as_user("admin")
    # A producer's serializer registers the schema of the topic it may write, and only that.
    value = AvroSerializer(alice, json.dumps(USER_V1))({"name": "x"}, SerializationContext("orders", MessageField.VALUE))
    orders_id = int.from_bytes(value[1:5], "big")
    assert alice.register_schema("shared-events-value", Schema(avro([NAME]), "AVRO")) == orders_id
    assert refused(lambda: alice.register_schema("payments-value", Schema(avro([NAME]), "AVRO"))) == (403, 40301)
    payments_id = admin_client.register_schema("payments-value", Schema(avro([NAME, AGE_DEFAULT]), "AVRO"))
    # A consumer's deserializer reads the schemas of the topic it may read; it lists only those.
    assert bob.get_schema(orders_id).schema_type == "AVRO"
    assert AvroDeserializer(bob)(value, SerializationContext("orders", MessageField.VALUE)) == {"name": "x"}
    assert bob.get_subjects() == ["orders-value"]
    assert bob.get_latest_version("orders-value").schema_id == orders_id
    assert refused(lambda: bob.get_schema(payments_id)) == (403, 40301)
    assert refused(lambda: bob.get_latest_version("payments-value")) == (403, 40301)
    assert refused(lambda: bob.register_schema("orders-value", Schema(avro([NAME, AGE_DEFAULT]), "AVRO"))) == (403, 40301)
    assert refused(lambda: bob.delete_subject("orders-value")) == (403, 40301)
    assert sorted(admin_client.get_subjects()) == ["orders-value", "payments-value", "shared-events-value"]
    # Deleting needs DELETE; the compatibility level needs ALTER_CONFIGS (the global one on the cluster).
    assert refused(lambda: alice.set_compatibility("orders-value", "NONE")) == (403, 40301)
    assert refused(lambda: alice.set_compatibility(level="NONE")) == (403, 40301)
    allow("User:alice", "orders", AclOperation.ALTER_CONFIGS)
    allow("User:alice", "orders", AclOperation.DELETE)
    assert alice.set_compatibility("orders-value", "NONE")["compatibility"] == "NONE"
    assert alice.delete_subject("orders-value") == [1]
    assert admin_client.set_compatibility(level="FULL")["compatibility"] == "FULL"


def test_three_nodes_answer_from_every_node_and_keep_ids_unique_through_a_leader_kill(tmp_path):
    from cluster_support import Cluster, wait_for

    registry_ports = {}

    def node_args(node_id, _port):
        registry_ports[node_id] = free_port()
        return ["--schema-registry-listen", f"127.0.0.1:{registry_ports[node_id]}"]

    cluster = Cluster(tmp_path, node_args=node_args).start()
    try:
        registries = {node: Registry(cluster.nodes[node], port) for node, port in registry_ports.items()}
        ids = {}
        # A write through every node: two of them forward it to the leader of _schemas.
        for node, registry in registries.items():
            subject = f"from-node-{node}-value"
            ids[subject] = wait_for(f"a registration through node {node}",
                                    lambda: registry.client().register_schema(subject, Schema(avro([NAME]), "AVRO")),
                                    timeout=60)
        # One schema, one id, whichever node took the write; every node answers every subject.
        assert len(set(ids.values())) == 1, ids
        for node, registry in registries.items():
            wait_for(f"node {node} answering every subject",
                     lambda: sorted(registry.client().get_subjects()) == sorted(ids), timeout=10)
        # Kill the leader of _schemas: the others elect one and go on giving new ids.
        leader, _, _ = cluster.partition_state("_schemas", 0)
        cluster.nodes[leader].kill()
        survivors = {node: r for node, r in registries.items() if node != leader}
        taken = set(ids.values())
        for n, (node, registry) in enumerate(survivors.items()):
            schema = Schema(avro([NAME, {"name": f"f{n}", "type": "int", "default": n}]), "AVRO")
            new_id = wait_for(f"a registration through node {node} after the leader's kill",
                              lambda: registry.client().register_schema("evolving-value", schema), timeout=60)
            assert new_id not in taken, (new_id, taken)
            taken.add(new_id)
        cluster.nodes[leader].start()
        back = registries[leader]
        wait_for("the restarted node answering every subject",
                 lambda: "evolving-value" in back.client().get_subjects(), timeout=60)
        versions = [back.client().get_version("evolving-value", v).schema_id for v in (1, 2)]
        assert set(versions) == taken - set(ids.values())
        # A node that holds no replica of _schemas (a cluster larger than its replication factor,
        # here after a reassignment) answers from the leader: reads and writes, and its own writes.
        from test_cluster_admin import alter_reassignment
        leader, _, _ = cluster.partition_state("_schemas", 0)
        outsider = next(node for node in registries if node != leader)
        keep = [leader] + [node for node in registries if node not in (leader, outsider)]
        assert alter_reassignment(cluster.nodes[leader].bootstrap, "_schemas", 0, keep)[:2] == (0, 0)
        wait_for("_schemas off the outsider", lambda: sorted(cluster.partition_state("_schemas", 0)[1]) == sorted(keep), timeout=30)
        outside = registries[outsider].client()
        assert sorted(outside.get_subjects()) == sorted([*ids, "evolving-value"])
        new_id = outside.register_schema("outside-value", Schema(avro([NAME, AGE_DEFAULT]), "AVRO"))
        assert outside.get_latest_version("outside-value").schema_id == new_id
    finally:
        cluster.kill_all()


def test_sluice_schema_commands(registry, tmp_path):
    import subprocess
    from conftest import SLUICE_BIN

    def sluice(*args, ok=True):
        result = subprocess.run([SLUICE_BIN, "schema", "--registry", registry.url, *args], capture_output=True,
                                text=True, timeout=60)
        assert (result.returncode == 0) == ok, f"{args}: {result.stdout}{result.stderr}"
        return result.stdout + result.stderr

    v1, v2 = tmp_path / "v1.avsc", tmp_path / "v2.avsc"
    v1.write_text(avro([NAME]))
    v2.write_text(avro([NAME, AGE]))
    assert "registered users-value: id 1" in sluice("register", "users-value", str(v1))
    assert sluice("list") == "users-value\n"
    shown = sluice("get", "users-value", "--version", "latest")
    assert shown.startswith("users-value version 1  id 1  type AVRO\n") and json.loads(shown.split("\n", 1)[1]) == json.loads(avro([NAME]))
    assert "used by users-value v1" in sluice("get", "--id", "1")
    # A field without a default breaks BACKWARD: check says why and exits 1; so does register.
    refused = sluice("check", "users-value", str(v2), ok=False)
    assert "incompatible with users-value" in refused and "must have a default value" in refused
    assert "(error 409)" in sluice("register", "users-value", str(v2), ok=False)
    assert sluice("compatibility", "users-value", "--set", "NONE") == "users-value: NONE\n"
    assert sluice("check", "users-value", str(v2)) == "compatible\n"
    assert "id 2" in sluice("register", "users-value", str(v2))
    assert sluice("get", "users-value") == "users-value: version(s) 1, 2\n"
    assert sluice("delete", "users-value") == "soft-deleted users-value version(s) 1, 2\n"
    assert sluice("delete", "users-value", "--permanent") == "permanently deleted users-value version(s) 1, 2\n"
    assert "Subject 'users-value' not found. (error 40401)" in sluice("get", "users-value", ok=False)
    assert sluice("mode", "--set", "READONLY") == "the registry: READONLY\n"
    assert "(error 42205)" in sluice("register", "users-value", str(v1), ok=False)
    unreachable = subprocess.run([SLUICE_BIN, "schema", "--registry", f"http://127.0.0.1:{free_port()}", "list"],
                                 capture_output=True, text=True, timeout=60)
    assert unreachable.returncode != 0 and "cannot reach the schema registry" in unreachable.stderr


def test_https_with_the_brokers_certificate_and_basic_auth(broker_factory, tmp_path):
    port = free_port()
    secure = start_secure_broker(broker_factory, tmp_path, "--schema-registry-listen", f"127.0.0.1:{port}",
                                 "--schema-registry-tls")
    add_user(secure.admin(), "alice", "alice-secret", [ScramMechanism.SCRAM_SHA_512])
    client = SchemaRegistryClient({"url": f"https://127.0.0.1:{port}", "ssl.ca.location": str(secure.pki.ca),
                                   "basic.auth.user.info": "alice:alice-secret"})
    schema_id = client.register_schema("s-value", Schema(avro([NAME]), "AVRO"))
    assert client.get_schema(schema_id).schema_type == "AVRO"
    # Plain HTTP on the HTTPS port gets no HTTP answer.
    import http.client
    with pytest.raises((urllib.error.URLError, OSError, http.client.HTTPException)):
        Registry(secure, port).call("GET", "/subjects")


def test_idle_and_half_sent_connections_do_not_stall_the_registry(registry):
    import socket
    import time
    host, port = "127.0.0.1", int(registry.url.rsplit(":", 1)[1])
    # Far more connections than the registry serves at once, each holding half a request.
    held = []
    for i in range(400):
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(b"POST /subjects/x/versions HTTP/1.1\r\nHost: x\r\nContent-Le")
        held.append(s)
    try:
        started = time.monotonic()
        client = registry.client()
        assert client.register_schema("s-value", Schema(avro([NAME]), "AVRO")) >= 1
        assert client.get_subjects() == ["s-value"]
        assert time.monotonic() - started < 5, "a client waited behind connections that send nothing"
    finally:
        for s in held:
            s.close()
    # The broker still serves Kafka clients.
    producer = Producer({"bootstrap.servers": registry.broker.bootstrap})
    producer.produce("after", b"v")
    assert producer.flush(10) == 0


def schemas_log(bootstrap: str) -> list[tuple[int, dict, bool]]:
    """(offset, key, is a tombstone) of every record of `_schemas`, read with a Kafka consumer
    from offset 0 through the partition's end."""
    import time
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "schemas-log-reader",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    try:
        _, end = consumer.get_watermark_offsets(TopicPartition("_schemas", 0), timeout=10)
        consumer.assign([TopicPartition("_schemas", 0, OFFSET_BEGINNING)])
        records = []
        deadline = time.monotonic() + 15
        while not records or records[-1][0] < end - 1:
            assert time.monotonic() < deadline, f"read only up to {records[-1:]} of _schemas, whose end is {end}"
            for message in consumer.consume(1000, 0.5):
                assert message.error() is None, message.error()
                records.append((message.offset(), json.loads(message.key()), message.value() is None))
        return records
    finally:
        consumer.close()


def test_ids_are_never_reused_after_deletes_and_compaction(broker_factory):
    """Schemas registered, then all permanently deleted, and `_schemas` compacted until
    neither their records nor their tombstones are left in it: after a kill -9 the registry
    rebuilds its state from what compaction kept, and a new schema still gets an id above
    every id given before."""
    import itertools
    import time
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    port = free_port()
    broker = broker_factory(extra_args=["--schema-registry-listen", f"127.0.0.1:{port}",
                                        "--override", "log.cleaner.backoff.ms=100"])
    registry = Registry(broker, port)
    client = registry.client()
    subjects = [f"deleted-{i}-value" for i in range(5)]
    given = [client.register_schema(subject, Schema(avro([NAME, {"name": f"f{i}", "type": "int"}]), "AVRO"))
             for i, subject in enumerate(subjects)]
    assert sorted(set(given)) == given, given
    # So that the cleaner takes `_schemas` at once: short segments, any dirty share cleans, and a
    # tombstone goes on the pass after the one that first cleaned it.
    settings = {"segment.ms": "200", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0.01",
                "delete.retention.ms": "0"}
    resource = ConfigResource(ResourceType.TOPIC, "_schemas", incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in settings.items()])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(10)
    for subject in subjects:
        client.delete_subject(subject)
        client.delete_subject(subject, permanent=True)
    assert client.get_subjects() == []
    # More writes (the registry's default level, back and forth) seal the segments holding
    # the deletes so the cleaner can take them; wait until no schema's key is left.
    levels = itertools.cycle(["FULL", "BACKWARD"])
    deadline = time.monotonic() + 20
    while True:
        level = next(levels)
        assert registry.call("PUT", "/config", {"compatibility": level}) == (200, {"compatibility": level})
        time.sleep(0.3)
        log = schemas_log(broker.bootstrap)
        left = [(offset, key, tombstone) for offset, key, tombstone in log if key["keytype"] == "SCHEMA"]
        if not left:
            break
        assert time.monotonic() < deadline, (
            f"_schemas still holds {len(left)} schema records or tombstones after 20 s, e.g. {left[:3]}; "
            f"the whole log: {log}\n--- broker log (tail) ---\n{broker.log()[-4000:]}")
    broker.kill()
    broker.start()
    client = registry.client()
    assert client.get_subjects() == []
    new = client.register_schema("after-value", Schema(avro([AGE]), "AVRO"))
    assert new > max(given), f"a new schema got id {new} after ids {given} were given and deleted"
    for old in given:
        status, body = registry.call("GET", f"/schemas/ids/{old}")
        assert (status, body["error_code"]) == (404, 40403), (old, status, body)
