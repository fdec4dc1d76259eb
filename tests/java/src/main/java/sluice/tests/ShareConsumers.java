package sluice.tests;

import static java.nio.charset.StandardCharsets.UTF_8;
import static sluice.tests.Check.check;
import static sluice.tests.Check.checkEq;
import static sluice.tests.Check.log;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.errors.GroupIdNotFoundException;
import org.apache.kafka.common.errors.InvalidMetadataException;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Share groups (KIP-932) with the Java client's KafkaShareConsumer, driven by
 * tests/python/test_share_groups.py. Modes ({@code --mode}):
 *
 * <ul>
 *   <li>{@code spread}: 4 consumers of one group on a 2-partition topic of at least
 *       {@code --count} records (implicit acknowledgement; more are produced until every
 *       consumer received some): every consumer receives records, and every record is
 *       delivered exactly once.</li>
 *   <li>{@code ack-types}: explicit acknowledgement on a 1-partition topic of 4 records:
 *       released records come back with delivery count 2, rejected ones never; a record
 *       released at the group's delivery limit (2) is archived; a record whose lock expires
 *       (the consumer holds it past {@code share.record.lock.duration.ms}) goes to another
 *       consumer with delivery count 2.</li>
 *   <li>{@code dead-letters}: with {@code errors.deadletterqueue.topic.name} set to
 *       {@code --dead-letter-topic} and a delivery limit of 2, on a 1-partition topic of 3
 *       records: k-0 is rejected, k-1 released twice (the limit), k-2 accepted; the test
 *       then reads the dead-letter topic.</li>
 *   <li>{@code renew}: Kafka 4.2's ShareFetch/ShareAcknowledge v2. A consumer in
 *       {@code share.acquire.mode=record_limit} with {@code max.poll.records=3} gets exactly 3
 *       of a 10-record batch (batch_optimized would take the whole batch); it renews their
 *       locks (RENEW, KIP-1222) for twice the group's 2 s lock duration while a second
 *       consumer takes the other 7 and never sees the renewed ones; then the first accepts
 *       them, which succeeds only if it still holds them.</li>
 *   <li>{@code consume}: one consumer accepts {@code --count} records (commitSync after each
 *       poll, so each acknowledgement is durable when it returns) and prints "ACKED key" for
 *       each, then exits without closing (as a crash would).</li>
 * </ul>
 *
 * Every mode first sets the group's {@code share.auto.offset.reset=earliest}
 * (IncrementalAlterConfigs on the GROUP resource), as Kafka's tools do.
 */
public final class ShareConsumers {
    private ShareConsumers() {}

    public static void main(String[] argv) {
        int rc = 0;
        try {
            run(Check.args(argv));
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
        Runtime.getRuntime().halt(rc);
    }

    static void run(Map<String, String> args) throws Exception {
        String bootstrap = Check.req(args, "bootstrap");
        String topic = Check.req(args, "topic");
        String group = Check.req(args, "group");
        String mode = Check.req(args, "mode");
        Map<String, String> groupConfigs = new HashMap<>();
        groupConfigs.put("share.auto.offset.reset", "earliest");
        if (mode.equals("dead-letters")) {
            groupConfigs.put("share.delivery.count.limit", "2");
            groupConfigs.put("errors.deadletterqueue.topic.name", Check.req(args, "dead-letter-topic"));
        }
        if (mode.equals("ack-types") || mode.equals("renew")) {
            groupConfigs.put("share.delivery.count.limit", "2");
            groupConfigs.put("share.record.lock.duration.ms", "2000");
        }
        setGroupConfigs(bootstrap, group, groupConfigs);
        switch (mode) {
            case "spread" -> spread(bootstrap, topic, group, Integer.parseInt(Check.req(args, "count")));
            case "ack-types" -> ackTypes(bootstrap, topic, group);
            case "consume" -> consume(bootstrap, topic, group, Integer.parseInt(Check.req(args, "count")));
            case "dead-letters" -> deadLetters(bootstrap, topic, group);
            case "renew" -> renew(bootstrap, topic, group);
            default -> throw new IllegalArgumentException("unknown mode " + mode);
        }
        log("DONE");
    }

    static void setGroupConfigs(String bootstrap, String group, Map<String, String> configs) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(p)) {
            List<AlterConfigOp> ops = new ArrayList<>();
            configs.forEach((k, v) -> ops.add(new AlterConfigOp(new ConfigEntry(k, v), AlterConfigOp.OpType.SET)));
            ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
            Check.get(admin.incrementalAlterConfigs(Map.of(resource, ops)).all(), "set group configs");
            var described = Check.get(admin.describeConfigs(List.of(resource)).all(), "describe group configs");
            for (var e : configs.entrySet()) {
                checkEq(e.getValue(), described.get(resource).get(e.getKey()).value(), "group config " + e.getKey());
            }
        }
    }

    static void createAndFill(String bootstrap, String topic, int partitions, int count) {
        createTopic(bootstrap, topic, partitions);
        fill(bootstrap, topic, partitions, count);
    }

    static void createTopic(String bootstrap, String topic, int partitions) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(p)) {
            Check.get(admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all(), "create " + topic);
        }
    }

    static KafkaProducer<byte[], byte[]> producer(String bootstrap) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return new KafkaProducer<>(p);
    }

    static void fill(String bootstrap, String topic, int partitions, int count) {
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap)) {
            for (int i = 0; i < count; i++) {
                byte[] key = ("k-" + i).getBytes(UTF_8);
                producer.send(new ProducerRecord<>(topic, i % partitions, key, key));
                // Batches of about 10 records: acquisition hands out whole batches (Kafka's
                // batch_optimized mode), so small ones let records spread over members.
                if (i % 20 == 19) producer.flush();
            }
            producer.flush();
        }
    }

    static KafkaShareConsumer<byte[], byte[]> consumer(String bootstrap, String group, boolean explicit) {
        return consumer(bootstrap, group, explicit, 500);
    }

    static KafkaShareConsumer<byte[], byte[]> consumer(String bootstrap, String group, boolean explicit, int maxPoll) {
        return consumer(bootstrap, group, explicit, maxPoll, "batch_optimized");
    }

    static KafkaShareConsumer<byte[], byte[]> consumer(
            String bootstrap, String group, boolean explicit, int maxPoll, String acquireMode) {
        Properties p = new Properties();
        p.put("share.acquire.mode", acquireMode);
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, Integer.toString(maxPoll));
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put("share.acknowledgement.mode", explicit ? "explicit" : "implicit");
        return new KafkaShareConsumer<>(p);
    }

    /** Waits (up to 60 s) until the share group has {@code members} members, each assigned a partition. */
    static void awaitAssignedMembers(String bootstrap, String group, int members) throws InterruptedException {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(p)) {
            long deadline = System.nanoTime() + 60_000_000_000L;
            while (true) {
                long assigned = 0;
                try {
                    var described = admin.describeShareGroups(List.of(group)).all().get().get(group);
                    assigned = described.members().stream()
                            .filter(m -> !m.assignment().topicPartitions().isEmpty())
                            .count();
                } catch (ExecutionException e) {
                    // Until the first member's heartbeat, the group does not exist.
                    check(e.getCause() instanceof GroupIdNotFoundException, "describe share group: " + e.getCause());
                }
                if (assigned >= members) return;
                check(System.nanoTime() < deadline, "members with an assignment after 60 s: " + assigned + " of " + members);
                Thread.sleep(100);
            }
        }
    }

    static String key(ConsumerRecord<byte[], byte[]> r) {
        return new String(r.key(), UTF_8);
    }

    static short deliveries(ConsumerRecord<byte[], byte[]> r) {
        Optional<Short> count = r.deliveryCount();
        check(count.isPresent(), "record " + key(r) + " has no delivery count");
        return count.get();
    }

    /** 4 consumers on 2 partitions: all receive records, each record exactly once. */
    static void spread(String bootstrap, String topic, String group, int count) throws Exception {
        createTopic(bootstrap, topic, 2);
        int members = 4;
        Map<String, Integer> seen = new ConcurrentHashMap<>();
        Map<Integer, Integer> perConsumer = new ConcurrentHashMap<>();
        AtomicBoolean stop = new AtomicBoolean();
        List<Thread> threads = new ArrayList<>();
        List<Throwable> errors = new ArrayList<>();
        for (int i = 0; i < members; i++) {
            int id = i;
            Thread t = new Thread(() -> {
                // Small polls: a member holds few records at a time, so slow work spreads.
                try (KafkaShareConsumer<byte[], byte[]> c = consumer(bootstrap, group, false, 10)) {
                    c.subscribe(List.of(topic));
                    while (!stop.get()) {
                        ConsumerRecords<byte[], byte[]> records = c.poll(Duration.ofMillis(200));
                        for (ConsumerRecord<byte[], byte[]> r : records) {
                            seen.merge(key(r), 1, Integer::sum);
                            perConsumer.merge(id, 1, Integer::sum);
                            // Slow work, so the records spread over the members.
                            Thread.sleep(5);
                        }
                    }
                    c.commitSync();
                } catch (Throwable e) {
                    synchronized (errors) {
                        errors.add(e);
                    }
                }
            });
            t.start();
            threads.add(t);
        }
        // The records go in once every member holds an assignment, and keep coming (past
        // `count` if need be) until every member received some: a member whose first fetch
        // comes after the others drained the topic would receive nothing, however well the
        // broker spreads.
        awaitAssignedMembers(bootstrap, group, members);
        int produced = fillUntilAllReceive(bootstrap, topic, count, perConsumer, members);
        long deadline = System.nanoTime() + 90_000_000_000L;
        while (seen.size() < produced && System.nanoTime() < deadline && errors.isEmpty()) {
            Thread.sleep(100);
        }
        // Give redeliveries (there must be none) a moment to show up.
        Thread.sleep(1_000);
        stop.set(true);
        for (Thread t : threads) t.join(30_000);
        check(errors.isEmpty(), "consumer errors: " + errors);
        log("PER_CONSUMER " + perConsumer + " of " + produced);
        checkEq(produced, seen.size(), "distinct records received");
        List<String> twice = seen.entrySet().stream().filter(e -> e.getValue() > 1).map(Map.Entry::getKey).toList();
        check(twice.isEmpty(), "records delivered more than once: " + twice);
        for (int i = 0; i < members; i++) {
            check(perConsumer.getOrDefault(i, 0) > 0, "consumer " + i + " received nothing: " + perConsumer);
        }
    }

    /**
     * Produces `count` records over 2 partitions in batches of 20, then more batches, paced,
     * until `members` consumers appear in `perConsumer` (for at most 60 s). Returns how many
     * records it produced.
     */
    static int fillUntilAllReceive(
            String bootstrap, String topic, int count, Map<Integer, Integer> perConsumer, int members)
            throws InterruptedException {
        long deadline = System.nanoTime() + 60_000_000_000L;
        int produced = 0;
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap)) {
            while (produced < count || (perConsumer.size() < members && System.nanoTime() < deadline)) {
                for (int i = 0; i < 20; i++, produced++) {
                    byte[] key = ("k-" + produced).getBytes(UTF_8);
                    producer.send(new ProducerRecord<>(topic, produced % 2, key, key));
                }
                // Batches of about 10 records per partition: acquisition hands out whole
                // batches (Kafka's batch_optimized mode), so small ones spread over members.
                producer.flush();
                if (produced >= count) Thread.sleep(50);
            }
        }
        return produced;
    }

    /** Polls `c` until it returns at least one record (or fails after 30 s). */
    static List<ConsumerRecord<byte[], byte[]>> pollSome(KafkaShareConsumer<byte[], byte[]> c) {
        long deadline = System.nanoTime() + 30_000_000_000L;
        while (System.nanoTime() < deadline) {
            List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>();
            c.poll(Duration.ofMillis(200)).forEach(out::add);
            if (!out.isEmpty()) return out;
        }
        throw Check.fail("no records within 30 s");
    }

    static void ackTypes(String bootstrap, String topic, String group) throws Exception {
        createAndFill(bootstrap, topic, 1, 4);
        Map<String, List<Short>> deliveries = new HashMap<>();
        Set<String> accepted = new HashSet<>();
        try (KafkaShareConsumer<byte[], byte[]> c = consumer(bootstrap, group, true)) {
            c.subscribe(List.of(topic));
            // First delivery: k-0 accept, k-1 release, k-2 reject, k-3 release.
            for (ConsumerRecord<byte[], byte[]> r : pollSome(c)) {
                deliveries.computeIfAbsent(key(r), k -> new ArrayList<>()).add(deliveries(r));
                AcknowledgeType type = switch (key(r)) {
                    case "k-0" -> AcknowledgeType.ACCEPT;
                    case "k-2" -> AcknowledgeType.REJECT;
                    default -> AcknowledgeType.RELEASE;
                };
                if (type == AcknowledgeType.ACCEPT) accepted.add(key(r));
                c.acknowledge(r, type);
            }
            c.commitSync();
            checkEq(Set.of("k-0", "k-1", "k-2", "k-3"), deliveries.keySet(), "first delivery");
            // Second delivery: the released k-1 and k-3 only, with delivery count 2. k-1 is
            // accepted; k-3 is released again, at the delivery limit (2): archived.
            List<ConsumerRecord<byte[], byte[]>> again = pollSome(c);
            Set<String> keys = new HashSet<>();
            for (ConsumerRecord<byte[], byte[]> r : again) {
                keys.add(key(r));
                checkEq((short) 2, deliveries(r), "delivery count of released " + key(r));
                c.acknowledge(r, key(r).equals("k-1") ? AcknowledgeType.ACCEPT : AcknowledgeType.RELEASE);
            }
            c.commitSync();
            checkEq(Set.of("k-1", "k-3"), keys, "redelivered after release");
            // Nothing comes back: k-2 was rejected, k-3 reached the delivery limit.
            long until = System.nanoTime() + 3_000_000_000L;
            while (System.nanoTime() < until) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    throw Check.fail("record " + key(r) + " delivered again (delivery " + deliveries(r) + ")");
                }
            }
        }
        log("ACK_TYPES_OK");
        // Lock expiry: a consumer holds a new record without acknowledging it; after the lock
        // duration (2 s) another consumer gets it with delivery count 2.
        try (KafkaProducer<byte[], byte[]> producer = producer(bootstrap)) {
            byte[] key = "k-held".getBytes(UTF_8);
            producer.send(new ProducerRecord<>(topic, 0, key, key)).get();
        }
        KafkaShareConsumer<byte[], byte[]> holder = consumer(bootstrap, group, true);
        holder.subscribe(List.of(topic));
        List<ConsumerRecord<byte[], byte[]>> held = pollSome(holder);
        checkEq(List.of("k-held"), held.stream().map(ShareConsumers::key).toList(), "held record");
        checkEq((short) 1, deliveries(held.get(0)), "first delivery count of the held record");
        long heldAt = System.nanoTime();
        try (KafkaShareConsumer<byte[], byte[]> other = consumer(bootstrap, group, true)) {
            other.subscribe(List.of(topic));
            List<ConsumerRecord<byte[], byte[]>> taken = pollSome(other);
            long afterMs = (System.nanoTime() - heldAt) / 1_000_000;
            checkEq(List.of("k-held"), taken.stream().map(ShareConsumers::key).toList(), "record after the lock expired");
            checkEq((short) 2, deliveries(taken.get(0)), "delivery count after the lock expired");
            check(afterMs >= 1_500, "redelivered after " + afterMs + " ms, before the 2 s lock expired");
            // While the other consumer holds it, the first holder's late acknowledgement fails.
            holder.acknowledge(held.get(0), AcknowledgeType.ACCEPT);
            Map<?, ?> result = holder.commitSync();
            boolean refused = result.values().stream().anyMatch(v -> ((Optional<?>) v).isPresent());
            check(refused, "a late acknowledgement of an expired lock was accepted: " + result);
            other.acknowledge(taken.get(0), AcknowledgeType.ACCEPT);
            other.commitSync();
            log("LOCK_EXPIRY_OK after " + afterMs + " ms");
        }
        holder.close();
    }

    static void deadLetters(String bootstrap, String topic, String group) {
        createAndFill(bootstrap, topic, 1, 3);
        Set<String> done = new HashSet<>();
        int releases = 0;
        try (KafkaShareConsumer<byte[], byte[]> c = consumer(bootstrap, group, true)) {
            c.subscribe(List.of(topic));
            long deadline = System.nanoTime() + 60_000_000_000L;
            while (done.size() < 3 && System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    switch (key(r)) {
                        case "k-0" -> {
                            c.acknowledge(r, AcknowledgeType.REJECT);
                            done.add("k-0");
                        }
                        case "k-1" -> {
                            c.acknowledge(r, AcknowledgeType.RELEASE);
                            releases++;
                            if (deliveries(r) == 2) done.add("k-1");
                        }
                        default -> {
                            c.acknowledge(r, AcknowledgeType.ACCEPT);
                            done.add(key(r));
                        }
                    }
                }
                c.commitSync();
            }
        }
        checkEq(Set.of("k-0", "k-1", "k-2"), done, "records handled");
        checkEq(2, releases, "releases of k-1");
    }

    static void renew(String bootstrap, String topic, String group) throws Exception {
        createAndFill(bootstrap, topic, 1, 10);
        long lockMs = 2_000;
        try (KafkaShareConsumer<byte[], byte[]> worker = consumer(bootstrap, group, true, 3, "record_limit");
             KafkaShareConsumer<byte[], byte[]> other = consumer(bootstrap, group, true, 500)) {
            worker.subscribe(List.of(topic));
            List<ConsumerRecord<byte[], byte[]>> first = pollSome(worker);
            List<String> held = first.stream().map(ShareConsumers::key).toList();
            checkEq(List.of("k-0", "k-1", "k-2"), held, "records of a record_limit poll of 3");
            other.subscribe(List.of(topic));
            Set<String> otherSaw = new HashSet<>();
            Set<String> workerExtra = new HashSet<>();
            long start = System.nanoTime();
            int renewals = 0;
            List<ConsumerRecord<byte[], byte[]>> holding = first;
            // Renew for twice the lock duration; the renewed records come back to the worker's
            // poll (the client hands them out again), never to the other consumer.
            while ((System.nanoTime() - start) / 1_000_000 < 2 * lockMs) {
                for (ConsumerRecord<byte[], byte[]> r : holding) {
                    checkEq((short) 1, deliveries(r), "delivery count of renewed " + key(r));
                    worker.acknowledge(r, AcknowledgeType.RENEW);
                }
                Map<TopicIdPartition, Optional<KafkaException>> renewed = worker.commitSync();
                check(renewed.values().stream().allMatch(Optional::isEmpty), "renewal refused: " + renewed);
                renewals++;
                acceptAll(other, otherSaw, Duration.ofMillis(400));
                check(otherSaw.stream().noneMatch(held::contains), "a renewed record went to another consumer: " + otherSaw);
                holding = pollUntilBack(worker, held, workerExtra);
            }
            for (ConsumerRecord<byte[], byte[]> r : holding) worker.acknowledge(r, AcknowledgeType.ACCEPT);
            Map<TopicIdPartition, Optional<KafkaException>> accepted = worker.commitSync();
            check(accepted.values().stream().allMatch(Optional::isEmpty), "accept after renewals failed: " + accepted);
            Set<String> rest = new HashSet<>();
            for (int i = 3; i < 10; i++) rest.add("k-" + i);
            long until = System.nanoTime() + 10_000_000_000L;
            while (!union(otherSaw, workerExtra).containsAll(rest) && System.nanoTime() < until) {
                acceptAll(other, otherSaw, Duration.ofMillis(200));
            }
            checkEq(rest, union(otherSaw, workerExtra), "the other records, each to one consumer");
            check(otherSaw.stream().noneMatch(workerExtra::contains), "a record went to both consumers");
            log("RENEW_OK after " + renewals + " renewals over " + (System.nanoTime() - start) / 1_000_000 + " ms");
        }
    }

    static Set<String> union(Set<String> a, Set<String> b) {
        Set<String> both = new HashSet<>(a);
        both.addAll(b);
        return both;
    }

    /** One poll of `c`, every record accepted (durably) and its key added to `seen`. */
    static void acceptAll(KafkaShareConsumer<byte[], byte[]> c, Set<String> seen, Duration wait) {
        for (ConsumerRecord<byte[], byte[]> r : c.poll(wait)) {
            check(seen.add(key(r)), "record " + key(r) + " delivered twice");
            c.acknowledge(r, AcknowledgeType.ACCEPT);
        }
        c.commitSync();
    }

    /**
     * Polls `c` until the renewed records `held` are handed out again (within 5 s) and returns
     * them; new records it acquires meanwhile are accepted and added to `extra`.
     */
    static List<ConsumerRecord<byte[], byte[]>> pollUntilBack(
            KafkaShareConsumer<byte[], byte[]> c, List<String> held, Set<String> extra) {
        List<ConsumerRecord<byte[], byte[]>> back = new ArrayList<>();
        long until = System.nanoTime() + 5_000_000_000L;
        while (back.size() < held.size() && System.nanoTime() < until) {
            for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(100))) {
                if (held.contains(key(r))) {
                    back.add(r);
                } else {
                    check(extra.add(key(r)), "record " + key(r) + " delivered twice");
                    c.acknowledge(r, AcknowledgeType.ACCEPT);
                }
            }
        }
        checkEq(held, back.stream().map(ShareConsumers::key).toList(), "records back after renewal");
        return back;
    }

    /** Accepts `count` records, each durable (commitSync) before it is printed. */
    static void consume(String bootstrap, String topic, String group, int count) {
        KafkaShareConsumer<byte[], byte[]> c = consumer(bootstrap, group, true);
        c.subscribe(List.of(topic));
        int acked = 0;
        long deadline = System.nanoTime() + 90_000_000_000L;
        while (acked < count && System.nanoTime() < deadline) {
            Collection<ConsumerRecord<byte[], byte[]>> batch = new ArrayList<>();
            c.poll(Duration.ofMillis(200)).forEach(batch::add);
            // Accepted keys by partition: a partition whose acknowledgement failed is not counted.
            Map<Integer, List<String>> done = new HashMap<>();
            int accepted = 0;
            for (ConsumerRecord<byte[], byte[]> r : batch) {
                if (acked + accepted < count) {
                    c.acknowledge(r, AcknowledgeType.ACCEPT);
                    done.computeIfAbsent(r.partition(), p -> new ArrayList<>()).add(key(r));
                    accepted++;
                } else {
                    c.acknowledge(r, AcknowledgeType.RELEASE);
                }
            }
            Map<TopicIdPartition, Optional<KafkaException>> result = c.commitSync();
            for (Map.Entry<TopicIdPartition, Optional<KafkaException>> e : result.entrySet()) {
                if (e.getValue().isEmpty()) continue;
                // The partition's leader moved (a failover, or leadership returning to a restarted
                // node): the old leader applied nothing, so these records are delivered again, as a
                // share group promises (at least once). Any other failure fails the run.
                check(e.getValue().get() instanceof InvalidMetadataException, "acknowledgement failed: " + e);
                System.err.println("acknowledgement not applied (leader moved), records come again: " + e);
                done.remove(e.getKey().partition());
            }
            for (List<String> keys : done.values()) {
                for (String k : keys) log("ACKED " + k);
                acked += keys.size();
            }
        }
        checkEq(count, acked, "records accepted");
        // No close(): the process ends as a crashed consumer would.
    }
}
