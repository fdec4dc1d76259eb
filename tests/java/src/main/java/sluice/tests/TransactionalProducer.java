package sluice.tests;

import static java.nio.charset.StandardCharsets.UTF_8;
import static sluice.tests.Check.check;
import static sluice.tests.Check.fail;
import static sluice.tests.Check.log;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Kafka transactions with the Java client, driven by tests/python/test_transactions.py.
 *
 * <pre>
 * --bootstrap HOST:PORT --topic T --transactional-id ID
 * </pre>
 *
 * <ol>
 *   <li>Creates T (1 partition) and a transactional producer (initTransactions).</li>
 *   <li>Transaction 1: "c-0".."c-49", committed. Transaction 2: "a-0".."a-99", flushed (so the
 *       records are in the log) and aborted. Transaction 3: "c-50".."c-99", committed.</li>
 *   <li>A read_committed consumer (assign + seekToBeginning, read up to endOffsets, i.e. the last
 *       stable offset) must see exactly "c-0".."c-99" in order; a read_uncommitted consumer all 200
 *       records in send order. Prints "COMMITTED_READ_OK ...".</li>
 *   <li>Transaction 4: "open-0".."open-9", flushed, left open; prints "OPEN" and waits for a line on
 *       stdin (the caller inspects the open transaction with kafka-transactions.sh meanwhile), then
 *       aborts it and prints "ABORTED".</li>
 *   <li>read_committed still sees exactly "c-0".."c-99"; read_uncommitted 210 records. Prints
 *       "PASS transactions" and exits 0; any mismatch prints "FAIL: ..." on stderr and exits 1.</li>
 * </ol>
 */
public final class TransactionalProducer {
    private TransactionalProducer() {}

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

    static void createTopic(String bootstrap, String topic) throws InterruptedException {
        long deadline = System.nanoTime() + 60_000_000_000L;
        while (true) {
            Properties p = new Properties();
            p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
            p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
            try (Admin admin = Admin.create(p)) {
                admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
                return;
            } catch (java.util.concurrent.ExecutionException e) {
                if (e.getCause() instanceof TopicExistsException) return;
                if (System.nanoTime() > deadline) throw new Check.Failure("createTopics failed: " + e.getCause(), e);
                Thread.sleep(500);
            }
        }
    }

    /** Every value in partition 0 of the topic, read from the beginning up to endOffsets (the
     *  high watermark for read_uncommitted, the last stable offset for read_committed). */
    static List<String> readAll(String bootstrap, String topic, String isolation) {
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        List<String> out = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c)) {
            TopicPartition tp = new TopicPartition(topic, 0);
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));
            long end = consumer.endOffsets(List.of(tp), Duration.ofSeconds(30)).get(tp);
            long deadline = System.nanoTime() + 60_000_000_000L;
            while (consumer.position(tp, Duration.ofSeconds(30)) < end) {
                if (System.nanoTime() > deadline) {
                    fail(isolation + " consumer did not reach end offset " + end + " within 60 s (position "
                            + consumer.position(tp) + ", read " + out.size() + " records)");
                }
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    out.add(new String(r.value(), UTF_8));
                }
            }
        }
        return out;
    }

    static List<String> range(String prefix, int from, int to) {
        List<String> out = new ArrayList<>();
        for (int i = from; i < to; i++) out.add(prefix + i);
        return out;
    }

    static void send(KafkaProducer<byte[], byte[]> producer, String topic, List<String> values) {
        for (String v : values) producer.send(new ProducerRecord<>(topic, 0, null, v.getBytes(UTF_8)));
        producer.flush();
    }

    static void expectSame(List<String> expected, List<String> actual, String what) {
        if (expected.equals(actual)) return;
        int i = 0;
        while (i < Math.min(expected.size(), actual.size()) && expected.get(i).equals(actual.get(i))) i++;
        fail(what + ": expected " + expected.size() + " records, got " + actual.size() + "; first difference at index "
                + i + ": expected " + (i < expected.size() ? expected.get(i) : "<end>") + ", got "
                + (i < actual.size() ? actual.get(i) : "<end>"));
    }

    static void run(Map<String, String> a) throws Exception {
        String bootstrap = Check.req(a, "bootstrap");
        String topic = Check.req(a, "topic");
        String txnId = Check.req(a, "transactional-id");
        createTopic(bootstrap, topic);

        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "30000");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());

        List<String> committed = new ArrayList<>(range("c-", 0, 50));
        committed.addAll(range("c-", 50, 100));
        List<String> everything = new ArrayList<>(range("c-", 0, 50));
        everything.addAll(range("a-", 0, 100));
        everything.addAll(range("c-", 50, 100));

        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            log("INITIALIZED transactional.id=" + txnId);

            producer.beginTransaction();
            send(producer, topic, range("c-", 0, 50));
            producer.commitTransaction();

            producer.beginTransaction();
            send(producer, topic, range("a-", 0, 100));
            producer.abortTransaction();

            producer.beginTransaction();
            send(producer, topic, range("c-", 50, 100));
            producer.commitTransaction();
            log("PRODUCED committed=100 aborted=100");

            expectSame(committed, readAll(bootstrap, topic, "read_committed"), "read_committed consumer");
            expectSame(everything, readAll(bootstrap, topic, "read_uncommitted"), "read_uncommitted consumer");
            log("COMMITTED_READ_OK committed=100 uncommitted=200");

            producer.beginTransaction();
            send(producer, topic, range("open-", 0, 10));
            log("OPEN");
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, UTF_8));
            String line = in.readLine();
            check(line != null, "stdin closed before the command to abort the open transaction");
            producer.abortTransaction();
            log("ABORTED");
        }

        expectSame(committed, readAll(bootstrap, topic, "read_committed"), "read_committed consumer after the abort");
        List<String> all = new ArrayList<>(everything);
        all.addAll(range("open-", 0, 10));
        expectSame(all, readAll(bootstrap, topic, "read_uncommitted"), "read_uncommitted consumer after the abort");
        log("PASS transactions");
    }
}
