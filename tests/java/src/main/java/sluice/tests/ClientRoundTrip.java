package sluice.tests;

import static java.nio.charset.StandardCharsets.UTF_8;
import static sluice.tests.Check.check;
import static sluice.tests.Check.checkEq;
import static sluice.tests.Check.expectFailure;
import static sluice.tests.Check.fail;
import static sluice.tests.Check.get;
import static sluice.tests.Check.log;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DeletedRecords;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.InvalidConfigurationException;
import org.apache.kafka.common.errors.InvalidPartitionsException;
import org.apache.kafka.common.errors.OffsetOutOfRangeException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.record.TimestampType;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Utils;

/**
 * End-to-end round trip with the Java client against a running broker.
 *
 * <pre>
 * --mode roundtrip --bootstrap HOST:PORT --compression none|gzip|snappy|lz4|zstd [--records 100000] [--partitions 16]
 *     Admin creates a topic; the producer (acks=all, idempotent by default) sends records with keys
 *     (some null), values (some null/empty), headers (duplicate keys, null values, binary) and explicit
 *     timestamps; every ack is checked (partition = the default partitioner's choice, contiguous
 *     offsets); a consumer (assign + seekToBeginning, no group) reads everything back and compares
 *     each record exactly, in order per partition; then offsetsForTimes and Admin.listOffsets
 *     (earliest / latest / maxTimestamp / by timestamp).
 * --mode admin --bootstrap HOST:PORT
 *     createTopics (with configs; duplicate -> TopicExistsException), listTopics, describeTopics,
 *     deleteRecords (+ beginningOffsets / listOffsets / consumption start moved; beyond the high
 *     watermark -> OffsetOutOfRangeException), describeConfigs / incrementalAlterConfigs (SET,
 *     DELETE, invalid value and unknown name -> InvalidConfigurationException), describeCluster,
 *     createPartitions (grow, produce/consume on a new partition, shrink -> InvalidPartitionsException),
 *     deleteTopics (gone from listTopics, describeTopics -> UnknownTopicOrPartitionException).
 * </pre>
 *
 * Prints progress to stdout; on any mismatch prints "FAIL: ..." to stderr and exits 1.
 */
public final class ClientRoundTrip {
    private ClientRoundTrip() {}

    public static void main(String[] argv) {
        int rc = 0;
        try {
            Map<String, String> a = Check.args(argv);
            String mode = Check.req(a, "mode");
            String bootstrap = Check.req(a, "bootstrap");
            switch (mode) {
                case "roundtrip" -> roundTrip(bootstrap, Check.req(a, "compression"),
                        Integer.parseInt(a.getOrDefault("records", "100000")),
                        Integer.parseInt(a.getOrDefault("partitions", "16")));
                case "admin" -> adminOps(bootstrap);
                default -> throw new IllegalArgumentException("unknown --mode " + mode);
            }
            log("PASS " + mode);
        } catch (Check.Failure f) {
            System.err.println("FAIL: " + f.getMessage());
            if (f.getCause() != null) f.getCause().printStackTrace();
            rc = 1;
        } catch (Throwable t) {
            System.err.println("FAIL: unexpected exception: " + t);
            t.printStackTrace();
            rc = 2;
        }
        System.out.flush();
        System.err.flush();
        // Client threads must not keep the JVM alive after a failure.
        Runtime.getRuntime().halt(rc);
    }

    // ---------------------------------------------------------------- clients

    static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.CLIENT_ID_CONFIG, "roundtrip-admin");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "60000");
        return Admin.create(p);
    }

    static KafkaProducer<byte[], byte[]> producer(String bootstrap, String compression) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, "roundtrip-producer-" + compression);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, compression);
        p.put(ProducerConfig.LINGER_MS_CONFIG, "10");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "65536");
        p.put(ProducerConfig.BUFFER_MEMORY_CONFIG, String.valueOf(64L << 20));
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return new KafkaProducer<>(p);
    }

    static KafkaConsumer<byte[], byte[]> consumer(String bootstrap) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "roundtrip-consumer");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        return new KafkaConsumer<>(p);
    }

    // ---------------------------------------------------------------- record content (deterministic)

    static byte[] key(int i) {
        if (i % 100 == 0) return null;
        return ("key-" + i).getBytes(UTF_8);
    }

    static byte[] value(String codec, int i) {
        if (i % 1000 == 1) return null;
        if (i % 1000 == 2) return new byte[0];
        SplittableRandom r = new SplittableRandom(i * 1_000_003L + codec.hashCode());
        byte[] prefix = ("value-" + codec + "-" + i + "-").getBytes(UTF_8);
        int len = prefix.length + 20 + r.nextInt(180);
        byte[] b = Arrays.copyOf(prefix, len);
        for (int j = prefix.length; j < len; j++) {
            // mostly compressible text with some arbitrary bytes mixed in
            b[j] = (j % 17 == 0) ? (byte) r.nextInt(256) : (byte) ('a' + r.nextInt(16));
        }
        return b;
    }

    static Header[] headers(String codec, int i) {
        List<Header> h = new ArrayList<>();
        h.add(new RecordHeader("seq", Integer.toString(i).getBytes(UTF_8)));
        h.add(new RecordHeader("codec", codec.getBytes(UTF_8)));
        if (i % 5 == 0) h.add(new RecordHeader("null-value", (byte[]) null));
        if (i % 7 == 0) h.add(new RecordHeader("seq", new byte[] {(byte) i, 0, (byte) 0xff}));
        if (i % 11 == 0) h.add(new RecordHeader("ünïcödé", new byte[0]));
        return h.toArray(new Header[0]);
    }

    static int expectedPartition(int i, int partitions) {
        byte[] k = key(i);
        if (k == null) return (i / 100) % partitions; // null keys are sent to an explicit partition
        return Utils.toPositive(Utils.murmur2(k)) % partitions; // what the default partitioner does
    }

    static String describe(ConsumerRecord<byte[], byte[]> r) {
        Header seq = r.headers().lastHeader("seq");
        return "record at " + r.topic() + "-" + r.partition() + "@" + r.offset() + " (key="
                + (r.key() == null ? "null" : new String(r.key(), UTF_8)) + ", first seq header="
                + (r.headers().headers("seq").iterator().hasNext()
                        ? new String(r.headers().headers("seq").iterator().next().value(), UTF_8) : "none")
                + ", last seq header=" + (seq == null ? "none" : Arrays.toString(seq.value())) + ")";
    }

    static void checkHeaders(Header[] expected, Header[] actual, String where) {
        if (expected.length != actual.length) {
            fail(where + ": expected " + expected.length + " headers " + Arrays.toString(expected) + " but got "
                    + actual.length + " " + Arrays.toString(actual));
        }
        for (int j = 0; j < expected.length; j++) {
            checkEq(expected[j].key(), actual[j].key(), where + ": header #" + j + " key");
            if (!Arrays.equals(expected[j].value(), actual[j].value())) {
                fail(where + ": header #" + j + " (" + expected[j].key() + ") value: expected "
                        + Arrays.toString(expected[j].value()) + " but got " + Arrays.toString(actual[j].value()));
            }
        }
    }

    // ---------------------------------------------------------------- roundtrip

    static void roundTrip(String bootstrap, String codec, int n, int partitions) throws Exception {
        String topic = "roundtrip-" + codec + "-" + Long.toHexString(System.nanoTime());
        long base = (System.currentTimeMillis() - 600_000L) / 1000 * 1000; // ts(i) = base + i
        long t0 = System.nanoTime();

        try (Admin admin = admin(bootstrap)) {
            get(admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all(), "createTopics " + topic);
            TopicDescription d = get(admin.describeTopics(List.of(topic)).allTopicNames(), "describeTopics").get(topic);
            checkEq(partitions, d.partitions().size(), "partition count of new topic " + topic);
        }
        log("created topic " + topic + " with " + partitions + " partitions");

        // ---- produce
        long[] ackOffset = new long[n];
        int[] ackPartition = new int[n];
        long[] ackTs = new long[n];
        AtomicInteger errors = new AtomicInteger();
        AtomicInteger acked = new AtomicInteger();
        AtomicReference<Exception> firstError = new AtomicReference<>();
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, codec)) {
            for (int i = 0; i < n; i++) {
                final int idx = i;
                byte[] k = key(i);
                Integer part = k == null ? expectedPartition(i, partitions) : null;
                ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>(topic, part, base + i, k, value(codec, i),
                        Arrays.asList(headers(codec, i)));
                producer.send(rec, (RecordMetadata md, Exception ex) -> {
                    if (ex != null) {
                        errors.incrementAndGet();
                        firstError.compareAndSet(null, ex);
                        return;
                    }
                    ackOffset[idx] = md.offset();
                    ackPartition[idx] = md.partition();
                    ackTs[idx] = md.timestamp();
                    acked.incrementAndGet();
                });
            }
            producer.flush();
        }
        long produceMs = (System.nanoTime() - t0) / 1_000_000;
        if (errors.get() > 0) {
            throw new Check.Failure(errors.get() + " of " + n + " sends failed (" + codec + "), first: "
                    + firstError.get(), firstError.get());
        }
        checkEq(n, acked.get(), "acknowledged sends");
        log("produced " + n + " records with compression=" + codec + " in " + produceMs + " ms");

        // Per partition, in send order: the producer is idempotent, so acks must be contiguous from 0.
        List<List<Integer>> perPart = new ArrayList<>();
        for (int p = 0; p < partitions; p++) perPart.add(new ArrayList<>());
        for (int i = 0; i < n; i++) {
            int exp = expectedPartition(i, partitions);
            if (ackPartition[i] != exp) {
                fail("record " + i + " was acked on partition " + ackPartition[i] + ", expected " + exp
                        + " (default partitioner / explicit partition)");
            }
            if (ackTs[i] != base + i) {
                fail("record " + i + " ack timestamp " + ackTs[i] + ", expected CreateTime " + (base + i));
            }
            List<Integer> l = perPart.get(exp);
            if (ackOffset[i] != l.size()) {
                fail("record " + i + " acked at " + topic + "-" + exp + "@" + ackOffset[i] + ", expected offset "
                        + l.size() + " (offsets must be contiguous, in send order)");
            }
            l.add(i);
        }
        for (int p = 0; p < partitions; p++) check(!perPart.get(p).isEmpty(), "partition " + p + " received nothing");

        // ---- consume
        long t1 = System.nanoTime();
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < partitions; p++) tps.add(new TopicPartition(topic, p));
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap)) {
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            int[] next = new int[partitions];
            int total = 0;
            long deadline = System.nanoTime() + 90_000_000_000L;
            while (total < n) {
                if (System.nanoTime() > deadline) {
                    fail("consumed only " + total + " of " + n + " records within 90 s; per partition: "
                            + Arrays.toString(next));
                }
                ConsumerRecords<byte[], byte[]> recs = consumer.poll(Duration.ofMillis(500));
                for (ConsumerRecord<byte[], byte[]> r : recs) {
                    int p = r.partition();
                    List<Integer> l = perPart.get(p);
                    if (next[p] >= l.size()) fail("unexpected extra " + describe(r) + ": only " + l.size() + " were produced");
                    int i = l.get(next[p]);
                    String where = describe(r) + " expected to be record " + i;
                    checkEq(ackOffset[i], r.offset(), where + ": offset");
                    if (!Arrays.equals(key(i), r.key())) fail(where + ": key differs");
                    if (!Arrays.equals(value(codec, i), r.value())) {
                        fail(where + ": value differs: expected " + Arrays.toString(value(codec, i)) + " got "
                                + Arrays.toString(r.value()));
                    }
                    checkHeaders(headers(codec, i), r.headers().toArray(), where);
                    checkEq(base + i, r.timestamp(), where + ": timestamp");
                    checkEq(TimestampType.CREATE_TIME, r.timestampType(), where + ": timestamp type");
                    next[p]++;
                    total++;
                }
            }
            // Nothing beyond what was produced.
            ConsumerRecords<byte[], byte[]> extra = consumer.poll(Duration.ofMillis(1000));
            if (!extra.isEmpty()) fail("unexpected extra " + describe(extra.iterator().next()));
            Map<TopicPartition, Long> end = consumer.endOffsets(tps, Duration.ofSeconds(30));
            Map<TopicPartition, Long> begin = consumer.beginningOffsets(tps, Duration.ofSeconds(30));
            for (int p = 0; p < partitions; p++) {
                TopicPartition tp = tps.get(p);
                checkEq((long) perPart.get(p).size(), end.get(tp), "endOffsets " + tp);
                checkEq(0L, begin.get(tp), "beginningOffsets " + tp);
                checkEq((long) perPart.get(p).size(), consumer.position(tp, Duration.ofSeconds(30)), "position " + tp);
            }
            long consumeMs = (System.nanoTime() - t1) / 1_000_000;
            log("consumed and verified " + total + " records in " + consumeMs + " ms");

            // ---- offsetsForTimes: the first offset whose timestamp >= target, per partition
            int[] targets = {-500, 0, 1, 777, n / 3, n / 2, n - 1, n, n + 1000};
            for (int x : targets) {
                Map<TopicPartition, Long> query = new HashMap<>();
                for (TopicPartition tp : tps) query.put(tp, base + x);
                Map<TopicPartition, OffsetAndTimestamp> res = consumer.offsetsForTimes(query, Duration.ofSeconds(30));
                for (int p = 0; p < partitions; p++) {
                    TopicPartition tp = tps.get(p);
                    Integer first = null;
                    for (int i : perPart.get(p)) {
                        if (i >= x) {
                            first = i;
                            break;
                        }
                    }
                    OffsetAndTimestamp got = res.get(tp);
                    String what = "offsetsForTimes(" + tp + ", base+" + x + ")";
                    if (first == null) {
                        if (got != null) fail(what + ": expected no offset (null) but got " + got);
                    } else {
                        if (got == null) fail(what + ": expected offset " + ackOffset[first] + " but got null");
                        checkEq(ackOffset[first], got.offset(), what + " offset");
                        checkEq(base + first, got.timestamp(), what + " timestamp");
                    }
                }
            }
            log("offsetsForTimes verified for " + targets.length + " timestamps x " + partitions + " partitions");
        }

        // ---- Admin.listOffsets: earliest, latest, max timestamp, by timestamp
        try (Admin admin = admin(bootstrap)) {
            Map<TopicPartition, OffsetSpec> earliest = new HashMap<>();
            Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
            Map<TopicPartition, OffsetSpec> maxTs = new HashMap<>();
            Map<TopicPartition, OffsetSpec> byTs = new HashMap<>();
            for (TopicPartition tp : tps) {
                earliest.put(tp, OffsetSpec.earliest());
                latest.put(tp, OffsetSpec.latest());
                maxTs.put(tp, OffsetSpec.maxTimestamp());
                byTs.put(tp, OffsetSpec.forTimestamp(base + n / 2));
            }
            Map<TopicPartition, ListOffsetsResultInfo> e = get(admin.listOffsets(earliest).all(), "listOffsets earliest");
            Map<TopicPartition, ListOffsetsResultInfo> l = get(admin.listOffsets(latest).all(), "listOffsets latest");
            Map<TopicPartition, ListOffsetsResultInfo> m = get(admin.listOffsets(maxTs).all(), "listOffsets maxTimestamp");
            Map<TopicPartition, ListOffsetsResultInfo> t = get(admin.listOffsets(byTs).all(), "listOffsets forTimestamp");
            for (int p = 0; p < partitions; p++) {
                TopicPartition tp = tps.get(p);
                List<Integer> ids = perPart.get(p);
                int last = ids.get(ids.size() - 1);
                checkEq(0L, e.get(tp).offset(), "listOffsets earliest " + tp);
                checkEq((long) ids.size(), l.get(tp).offset(), "listOffsets latest " + tp);
                checkEq(ackOffset[last], m.get(tp).offset(), "listOffsets maxTimestamp offset " + tp);
                checkEq(base + last, m.get(tp).timestamp(), "listOffsets maxTimestamp timestamp " + tp);
                Integer first = null;
                for (int i : ids) {
                    if (i >= n / 2) {
                        first = i;
                        break;
                    }
                }
                if (first == null) {
                    checkEq(-1L, t.get(tp).offset(), "listOffsets forTimestamp(base+n/2) " + tp + " (none: -1)");
                } else {
                    checkEq(ackOffset[first], t.get(tp).offset(), "listOffsets forTimestamp(base+n/2) offset " + tp);
                    checkEq(base + first, t.get(tp).timestamp(), "listOffsets forTimestamp(base+n/2) timestamp " + tp);
                }
            }
            log("Admin.listOffsets earliest/latest/maxTimestamp/forTimestamp verified");
        }
        log("roundtrip compression=" + codec + " records=" + n + " partitions=" + partitions + " total_ms="
                + (System.nanoTime() - t0) / 1_000_000);
    }

    // ---------------------------------------------------------------- admin

    static Map<String, ConfigEntry> topicConfig(Admin admin, String topic) {
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        Map<ConfigResource, Config> m = get(admin.describeConfigs(List.of(res)).all(), "describeConfigs " + topic);
        Config c = m.get(res);
        check(c != null, "describeConfigs returned nothing for topic " + topic);
        Map<String, ConfigEntry> out = new TreeMap<>();
        for (ConfigEntry e : c.entries()) out.put(e.name(), e);
        return out;
    }

    /** describeConfigs until `name` has `value` (at most 10 s), then returns the whole config. */
    static Map<String, ConfigEntry> awaitConfig(Admin admin, String topic, String name, String value)
            throws InterruptedException {
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (true) {
            Map<String, ConfigEntry> cfg = topicConfig(admin, topic);
            ConfigEntry e = cfg.get(name);
            if (e != null && value.equals(e.value())) return cfg;
            if (System.nanoTime() > deadline) {
                fail("describeConfigs of " + topic + ": " + name + " is " + e + ", expected value " + value
                        + " (waited 10 s after the change)");
            }
            Thread.sleep(100);
        }
    }

    static void alter(Admin admin, String topic, AlterConfigOp... ops) {
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        Map<ConfigResource, Collection<AlterConfigOp>> m = Map.of(res, Arrays.asList(ops));
        get(admin.incrementalAlterConfigs(m).all(), "incrementalAlterConfigs " + Arrays.toString(ops));
    }

    static void adminOps(String bootstrap) throws Exception {
        String topic = "admin-" + Long.toHexString(System.nanoTime());
        String other = topic + "-other";
        int partitions = 16;
        int perPartition = 100;
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < partitions; p++) tps.add(new TopicPartition(topic, p));

        try (Admin admin = admin(bootstrap)) {
            // ---- describeCluster
            DescribeClusterResult cluster = admin.describeCluster();
            String clusterId = get(cluster.clusterId(), "describeCluster clusterId");
            Collection<Node> nodes = get(cluster.nodes(), "describeCluster nodes");
            Node controller = get(cluster.controller(), "describeCluster controller");
            check(clusterId != null && !clusterId.isEmpty(), "describeCluster: empty cluster id");
            checkEq(1, nodes.size(), "describeCluster: number of nodes " + nodes);
            Node node = nodes.iterator().next();
            String[] hp = bootstrap.split(":");
            checkEq(hp[0], node.host(), "describeCluster: node host");
            checkEq(Integer.parseInt(hp[1]), node.port(), "describeCluster: node port");
            check(controller != null && !controller.isEmpty(), "describeCluster: no controller");
            checkEq(node.id(), controller.id(), "describeCluster: controller id");
            log("describeCluster: clusterId=" + clusterId + " node=" + node + " controller=" + controller.id());

            // ---- createTopics with configs, duplicate create, listTopics, describeTopics
            NewTopic nt = new NewTopic(topic, partitions, (short) 1).configs(Map.of("retention.ms", "86400000",
                    "max.message.bytes", "2097152"));
            get(admin.createTopics(List.of(nt, new NewTopic(other, 3, (short) 1))).all(), "createTopics");
            expectFailure(admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all(),
                    TopicExistsException.class, "createTopics of an existing topic");
            Set<String> names = get(admin.listTopics().names(), "listTopics");
            check(names.contains(topic) && names.contains(other), "listTopics " + names + " lacks " + topic + " / " + other);
            TopicDescription desc = get(admin.describeTopics(List.of(topic)).allTopicNames(), "describeTopics").get(topic);
            checkEq(partitions, desc.partitions().size(), "describeTopics partitions");
            check(!desc.isInternal(), "new topic reported internal");
            for (TopicPartitionInfo pi : desc.partitions()) {
                check(pi.leader() != null && pi.leader().id() == node.id(), "partition " + pi.partition()
                        + " leader " + pi.leader() + " is not node " + node.id());
                checkEq(List.of(node), pi.replicas(), "replicas of partition " + pi.partition());
                checkEq(List.of(node), pi.isr(), "isr of partition " + pi.partition());
            }
            log("createTopics/listTopics/describeTopics ok");

            // ---- describeConfigs: creation configs and the documented defaults
            Map<String, ConfigEntry> cfg = awaitConfig(admin, topic, "retention.ms", "86400000");
            for (String name : List.of("retention.ms", "retention.bytes", "segment.bytes", "max.message.bytes",
                    "flush.messages", "flush.ms")) {
                check(cfg.containsKey(name), "describeConfigs lacks " + name + "; has " + cfg.keySet());
            }
            checkEq("86400000", cfg.get("retention.ms").value(), "retention.ms set at creation");
            checkEq(ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG, cfg.get("retention.ms").source(), "retention.ms source");
            checkEq("2097152", cfg.get("max.message.bytes").value(), "max.message.bytes set at creation");
            checkEq("-1", cfg.get("retention.bytes").value(), "retention.bytes default");
            check(cfg.get("retention.bytes").source() != ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
                    "retention.bytes (never set) reported as DYNAMIC_TOPIC_CONFIG");

            // ---- incrementalAlterConfigs: SET, then DELETE back to the default
            alter(admin, topic,
                    new AlterConfigOp(new ConfigEntry("retention.ms", "123456789"), AlterConfigOp.OpType.SET),
                    new AlterConfigOp(new ConfigEntry("retention.bytes", "1073741824"), AlterConfigOp.OpType.SET));
            // Kafka applies config changes asynchronously; allow a short delay before they show.
            cfg = awaitConfig(admin, topic, "retention.ms", "123456789");
            cfg = awaitConfig(admin, topic, "retention.bytes", "1073741824");
            checkEq("123456789", cfg.get("retention.ms").value(), "retention.ms after SET");
            checkEq("1073741824", cfg.get("retention.bytes").value(), "retention.bytes after SET");
            checkEq(ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG, cfg.get("retention.bytes").source(),
                    "retention.bytes source after SET");
            checkEq("2097152", cfg.get("max.message.bytes").value(), "max.message.bytes untouched by another SET");
            alter(admin, topic, new AlterConfigOp(new ConfigEntry("retention.ms", ""), AlterConfigOp.OpType.DELETE));
            cfg = awaitConfig(admin, topic, "retention.ms", "604800000");
            checkEq("604800000", cfg.get("retention.ms").value(), "retention.ms after DELETE (default 7 days)");
            check(cfg.get("retention.ms").source() != ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
                    "retention.ms still DYNAMIC_TOPIC_CONFIG after DELETE");
            checkEq("1073741824", cfg.get("retention.bytes").value(), "retention.bytes untouched by DELETE of retention.ms");
            ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
            expectFailure(admin.incrementalAlterConfigs(Map.of(res, List.of(new AlterConfigOp(
                    new ConfigEntry("retention.ms", "not-a-number"), AlterConfigOp.OpType.SET)))).all(),
                    InvalidConfigurationException.class, "SET retention.ms=not-a-number");
            expectFailure(admin.incrementalAlterConfigs(Map.of(res, List.of(new AlterConfigOp(
                    new ConfigEntry("no.such.config", "1"), AlterConfigOp.OpType.SET)))).all(),
                    InvalidConfigurationException.class, "SET of an unknown config name");
            cfg = topicConfig(admin, topic);
            checkEq("604800000", cfg.get("retention.ms").value(), "retention.ms after rejected SET");
            log("describeConfigs/incrementalAlterConfigs ok");

            // ---- produce 100 records to each partition
            try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, "none")) {
                for (int i = 0; i < perPartition; i++) {
                    for (int p = 0; p < partitions; p++) {
                        producer.send(new ProducerRecord<>(topic, p, ("k" + i).getBytes(UTF_8),
                                ("p" + p + "-v" + i).getBytes(UTF_8)));
                    }
                }
                producer.flush();
                // surface any send error
                producer.send(new ProducerRecord<>(other, 0, null, "x".getBytes(UTF_8))).get();
            }

            // ---- deleteRecords: partition p truncated before offset 5*p
            Map<TopicPartition, RecordsToDelete> del = new HashMap<>();
            for (int p = 0; p < partitions; p++) del.put(tps.get(p), RecordsToDelete.beforeOffset(5L * p));
            Map<TopicPartition, org.apache.kafka.common.KafkaFuture<DeletedRecords>> dr = admin.deleteRecords(del).lowWatermarks();
            for (int p = 0; p < partitions; p++) {
                DeletedRecords d = get(dr.get(tps.get(p)), "deleteRecords " + tps.get(p));
                checkEq(5L * p, d.lowWatermark(), "deleteRecords low watermark of " + tps.get(p));
            }
            expectFailure(admin.deleteRecords(Map.of(tps.get(1), RecordsToDelete.beforeOffset(perPartition + 10L))).all(),
                    OffsetOutOfRangeException.class, "deleteRecords beyond the high watermark");

            Map<TopicPartition, OffsetSpec> earliest = new HashMap<>();
            for (TopicPartition tp : tps) earliest.put(tp, OffsetSpec.earliest());
            Map<TopicPartition, ListOffsetsResultInfo> lo = get(admin.listOffsets(earliest).all(), "listOffsets earliest");
            try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap)) {
                Map<TopicPartition, Long> begin = consumer.beginningOffsets(tps, Duration.ofSeconds(30));
                Map<TopicPartition, Long> end = consumer.endOffsets(tps, Duration.ofSeconds(30));
                for (int p = 0; p < partitions; p++) {
                    TopicPartition tp = tps.get(p);
                    checkEq(5L * p, begin.get(tp), "beginningOffsets after deleteRecords " + tp);
                    checkEq(5L * p, lo.get(tp).offset(), "listOffsets earliest after deleteRecords " + tp);
                    checkEq((long) perPartition, end.get(tp), "endOffsets after deleteRecords " + tp);
                }
                // A consumer starting from the beginning now starts at the new log start offset.
                TopicPartition tp15 = tps.get(15);
                consumer.assign(List.of(tp15));
                consumer.seekToBeginning(List.of(tp15));
                List<ConsumerRecord<byte[], byte[]>> got = new ArrayList<>();
                long deadline = System.nanoTime() + 30_000_000_000L;
                while (got.size() < perPartition - 75 && System.nanoTime() < deadline) {
                    for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) got.add(r);
                }
                checkEq(perPartition - 75, got.size(), "records readable from " + tp15 + " after deleteRecords(75)");
                for (int j = 0; j < got.size(); j++) {
                    ConsumerRecord<byte[], byte[]> r = got.get(j);
                    checkEq(75L + j, r.offset(), "offset of record #" + j + " after deleteRecords");
                    checkEq("p15-v" + (75 + j), new String(r.value(), UTF_8), "value at " + tp15 + "@" + r.offset());
                }
            }
            log("deleteRecords ok");

            // ---- createPartitions: 16 -> 20, use a new partition; shrinking is refused
            get(admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(20))).all(), "createPartitions 16->20");
            long cpDeadline = System.nanoTime() + 10_000_000_000L;
            while (true) {
                desc = get(admin.describeTopics(List.of(topic)).allTopicNames(), "describeTopics").get(topic);
                if (desc.partitions().size() == 20 || System.nanoTime() > cpDeadline) break;
                Thread.sleep(100);
            }
            checkEq(20, desc.partitions().size(), "partitions after createPartitions (waited up to 10 s)");
            expectFailure(admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(10))).all(),
                    InvalidPartitionsException.class, "createPartitions to fewer partitions");
            TopicPartition tp19 = new TopicPartition(topic, 19);
            try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap, "none")) {
                RecordMetadata md = producer.send(new ProducerRecord<>(topic, 19, "k".getBytes(UTF_8),
                        "on-new-partition".getBytes(UTF_8))).get();
                checkEq(19, md.partition(), "partition of record sent to new partition");
                checkEq(0L, md.offset(), "offset of first record in new partition");
            }
            try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap)) {
                consumer.assign(List.of(tp19));
                consumer.seekToBeginning(List.of(tp19));
                List<ConsumerRecord<byte[], byte[]>> got = new ArrayList<>();
                long deadline = System.nanoTime() + 30_000_000_000L;
                while (got.isEmpty() && System.nanoTime() < deadline) {
                    for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) got.add(r);
                }
                checkEq(1, got.size(), "records read from new partition " + tp19);
                checkEq("on-new-partition", new String(got.get(0).value(), UTF_8), "value read from " + tp19);
            }
            log("createPartitions ok");

            // ---- deleteTopics
            get(admin.deleteTopics(List.of(topic)).all(), "deleteTopics " + topic);
            long deadline = System.nanoTime() + 15_000_000_000L;
            while (true) {
                names = get(admin.listTopics().names(), "listTopics");
                if (!names.contains(topic)) break;
                if (System.nanoTime() > deadline) fail("deleted topic " + topic + " still listed after 15 s: " + names);
                Thread.sleep(200);
            }
            check(names.contains(other), "deleting " + topic + " also removed " + other + ": " + names);
            expectFailure(admin.describeTopics(List.of(topic)).allTopicNames(), UnknownTopicOrPartitionException.class,
                    "describeTopics of a deleted topic");
            expectFailure(admin.deleteTopics(List.of(topic)).all(), UnknownTopicOrPartitionException.class,
                    "deleteTopics of a deleted topic");
            log("deleteTopics/listTopics ok");
        }
    }
}
