package sluice.tests;

import static java.nio.charset.StandardCharsets.UTF_8;
import static sluice.tests.Check.fail;
import static sluice.tests.Check.log;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Idempotent producer under connection loss.
 *
 * <pre>
 * --bootstrap HOST:PORT --topic T [--partitions 6] [--records 100000] [--rate 5000] [--compression none]
 * </pre>
 *
 * Creates the topic (retrying while the broker is unreachable), prints "READY", then sends record i
 * (value "i", key "k-i") to partition i % partitions with the default idempotent producer
 * (acks=all, retries=MAX, max.in.flight=5), paced at --rate records/s, printing "PROGRESS ..." every
 * second. The caller cuts connections / kills the broker meanwhile. After flush it prints
 * "PRODUCED ...", then reads every partition from the beginning with a fresh consumer and checks:
 * every send was acknowledged, each partition holds exactly its records once, in send order, at the
 * acknowledged offsets (no duplicates, no gaps). Prints "RESULT {json}" and exits 0 if all holds,
 * else "FAIL: ..." on stderr and exit 1.
 */
public final class IdempotentProducer {
    private IdempotentProducer() {}

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

    static void createTopic(String bootstrap, String topic, int partitions) throws InterruptedException {
        long deadline = System.nanoTime() + 60_000_000_000L;
        while (true) {
            Properties p = new Properties();
            p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
            p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
            try (Admin admin = Admin.create(p)) {
                admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
                return;
            } catch (java.util.concurrent.ExecutionException e) {
                if (e.getCause() instanceof TopicExistsException) return;
                if (System.nanoTime() > deadline) throw new Check.Failure("createTopics failed: " + e.getCause(), e);
                Thread.sleep(500);
            }
        }
    }

    static double metric(KafkaProducer<?, ?> producer, String name) {
        double sum = 0;
        for (Map.Entry<MetricName, ? extends Metric> e : producer.metrics().entrySet()) {
            if (e.getKey().group().equals("producer-metrics") && e.getKey().name().equals(name)) {
                Object v = e.getValue().metricValue();
                if (v instanceof Number num) sum += num.doubleValue();
            }
        }
        return sum;
    }

    static void run(Map<String, String> a) throws Exception {
        String bootstrap = Check.req(a, "bootstrap");
        String topic = Check.req(a, "topic");
        int partitions = Integer.parseInt(a.getOrDefault("partitions", "6"));
        int n = Integer.parseInt(a.getOrDefault("records", "100000"));
        double rate = Double.parseDouble(a.getOrDefault("rate", "5000"));
        String compression = a.getOrDefault("compression", "none");

        createTopic(bootstrap, topic, partitions);
        log("READY topic=" + topic);

        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, "idempotent-producer");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, "5");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, compression);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        // retries and delivery.timeout.ms stay at their defaults (MAX_VALUE, 120 s). send() may wait
        // for metadata while the broker restarts: allow longer than the 60 s default for that.
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "180000");

        long[] ackOffset = new long[n];
        Arrays.fill(ackOffset, -1);
        AtomicInteger acked = new AtomicInteger();
        AtomicInteger errors = new AtomicInteger();
        ConcurrentLinkedQueue<String> errorSamples = new ConcurrentLinkedQueue<>();
        AtomicLong wrongPartition = new AtomicLong();
        double retries;
        double recordErrors;
        long t0 = System.nanoTime();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            long lastReport = System.nanoTime();
            for (int i = 0; i < n; i++) {
                // pace: record i is due at t0 + i / rate
                long due = t0 + (long) (i / rate * 1e9);
                long now = System.nanoTime();
                if (due > now) Thread.sleep((due - now) / 1_000_000, (int) ((due - now) % 1_000_000));
                if (now - lastReport > 1_000_000_000L) {
                    lastReport = now;
                    log("PROGRESS sent=" + i + " acked=" + acked.get() + " errors=" + errors.get()
                            + " retries=" + (long) metric(producer, "record-retry-total"));
                }
                final int idx = i;
                int part = i % partitions;
                producer.send(new ProducerRecord<>(topic, part, ("k-" + i).getBytes(UTF_8),
                        Integer.toString(i).getBytes(UTF_8)), (md, ex) -> {
                            if (ex != null) {
                                if (errors.incrementAndGet() <= 5) errorSamples.add("record " + idx + ": " + ex);
                                return;
                            }
                            if (md.partition() != part) wrongPartition.incrementAndGet();
                            ackOffset[idx] = md.offset();
                            acked.incrementAndGet();
                        });
            }
            producer.flush();
            retries = metric(producer, "record-retry-total");
            recordErrors = metric(producer, "record-error-total");
        }
        long produceMs = (System.nanoTime() - t0) / 1_000_000;
        log("PRODUCED records=" + n + " acked=" + acked.get() + " errors=" + errors.get() + " retries=" + (long) retries
                + " ms=" + produceMs);

        List<String> problems = new ArrayList<>();
        if (errors.get() > 0) problems.add(errors.get() + " sends failed, e.g. " + errorSamples);
        if (wrongPartition.get() > 0) problems.add(wrongPartition.get() + " acks on the wrong partition");

        // ---- read everything back
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.CLIENT_ID_CONFIG, "idempotence-verifier");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        long duplicates = 0;
        long outOfOrder = 0;
        long offsetMismatch = 0;
        long foreign = 0;
        long missing = 0;
        long consumed = 0;
        List<String> samples = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int q = 0; q < partitions; q++) tps.add(new TopicPartition(topic, q));
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> end = consumer.endOffsets(tps, Duration.ofSeconds(60));
            Map<TopicPartition, Long> begin = consumer.beginningOffsets(tps, Duration.ofSeconds(60));
            long[] endOff = new long[partitions];
            for (int q = 0; q < partitions; q++) {
                endOff[q] = end.get(tps.get(q));
                if (begin.get(tps.get(q)) != 0L) problems.add("log start offset of " + tps.get(q) + " is " + begin.get(tps.get(q)));
            }
            // expected[q] = the next index i (i % partitions == q) we expect to read in partition q
            long[] expected = new long[partitions];
            for (int q = 0; q < partitions; q++) expected[q] = q;
            boolean[] seen = new boolean[n];
            long[] lastOffset = new long[partitions];
            Arrays.fill(lastOffset, -1);
            long deadline = System.nanoTime() + 120_000_000_000L;
            while (true) {
                boolean done = true;
                for (int q = 0; q < partitions; q++) {
                    if (consumer.position(tps.get(q), Duration.ofSeconds(60)) < endOff[q]) done = false;
                }
                if (done) break;
                if (System.nanoTime() > deadline) {
                    fail("could not read up to the end offsets " + end + " within 120 s (consumed " + consumed + ")");
                }
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) {
                    consumed++;
                    int q = r.partition();
                    if (r.offset() <= lastOffset[q]) fail("offsets went backwards in partition " + q);
                    lastOffset[q] = r.offset();
                    int i;
                    try {
                        i = Integer.parseInt(new String(r.value(), UTF_8));
                    } catch (RuntimeException e) {
                        foreign++;
                        if (samples.size() < 10) samples.add("unparseable value at " + q + "@" + r.offset());
                        continue;
                    }
                    if (i < 0 || i >= n || i % partitions != q) {
                        foreign++;
                        if (samples.size() < 10) samples.add("record " + i + " found in partition " + q + "@" + r.offset());
                        continue;
                    }
                    if (!Arrays.equals(("k-" + i).getBytes(UTF_8), r.key())) {
                        foreign++;
                        if (samples.size() < 10) samples.add("record " + i + " has the wrong key at " + q + "@" + r.offset());
                    }
                    if (seen[i]) {
                        duplicates++;
                        if (samples.size() < 10) samples.add("duplicate of record " + i + " at " + q + "@" + r.offset());
                        continue;
                    }
                    seen[i] = true;
                    if (i != expected[q]) {
                        if (i > expected[q]) {
                            outOfOrder++;
                            if (samples.size() < 10) {
                                samples.add("partition " + q + "@" + r.offset() + ": expected record " + expected[q]
                                        + " next but found " + i + " (gap or reordering)");
                            }
                        } else {
                            outOfOrder++;
                            if (samples.size() < 10) samples.add("record " + i + " out of order at " + q + "@" + r.offset());
                        }
                    }
                    expected[q] = Math.max(expected[q], i + partitions);
                    if (ackOffset[i] >= 0 && ackOffset[i] != r.offset()) {
                        offsetMismatch++;
                        if (samples.size() < 10) {
                            samples.add("record " + i + " acked at offset " + ackOffset[i] + " but found at " + q + "@" + r.offset());
                        }
                    }
                }
            }
            for (int i = 0; i < n; i++) {
                if (!seen[i]) {
                    missing++;
                    if (samples.size() < 10) {
                        samples.add("record " + i + " missing from partition " + (i % partitions)
                                + (ackOffset[i] >= 0 ? " although acked at offset " + ackOffset[i] : " (never acked)"));
                    }
                }
            }
        }
        if (duplicates > 0) problems.add(duplicates + " duplicate records");
        if (missing > 0) problems.add(missing + " records missing (gaps)");
        if (outOfOrder > 0) problems.add(outOfOrder + " records out of send order");
        if (offsetMismatch > 0) problems.add(offsetMismatch + " records not at their acknowledged offset");
        if (foreign > 0) problems.add(foreign + " unexpected/corrupt records");
        if (consumed != n && problems.isEmpty()) problems.add("consumed " + consumed + " records, expected " + n);

        log("RESULT {\"records\": " + n + ", \"acked\": " + acked.get() + ", \"send_errors\": " + errors.get()
                + ", \"retries\": " + (long) retries + ", \"record_errors\": " + (long) recordErrors
                + ", \"consumed\": " + consumed + ", \"duplicates\": " + duplicates + ", \"missing\": " + missing
                + ", \"out_of_order\": " + outOfOrder + ", \"offset_mismatch\": " + offsetMismatch
                + ", \"foreign\": " + foreign + ", \"produce_ms\": " + produceMs + "}");
        if (!problems.isEmpty()) {
            fail(String.join("; ", problems) + (samples.isEmpty() ? "" : "\n  examples:\n    " + String.join("\n    ", samples)));
        }
    }
}
