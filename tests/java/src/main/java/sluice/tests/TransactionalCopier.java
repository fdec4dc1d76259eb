package sluice.tests;

import static java.nio.charset.StandardCharsets.UTF_8;
import static sluice.tests.Check.log;

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.stream.Collectors;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.UnsupportedVersionException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * A consume-transform-produce loop with the Java client's transactions, as an exactly-once
 * application writes it; driven by tests/python/test_transactions.py, which kills the broker
 * with SIGKILL while it runs.
 *
 * <pre>
 * --bootstrap HOST:PORT --input IN --output OUT --group G --transactional-id ID --expect N
 * </pre>
 *
 * <p>A read_committed consumer in group G polls IN; each poll becomes one transaction that
 * writes every record to OUT with "!" appended to its value and commits the consumer's next
 * offsets with {@code sendOffsetsToTransaction(offsets, consumer.groupMetadata())}. Every third
 * transaction is aborted after its records were flushed to the log, and the consumer is rewound
 * to the group's committed offsets. Errors are handled as the client documents: fatal ones
 * (fenced, out of order, epoch) close the producer and start a new one with the same
 * transactional id; abortable ones abort; timeouts (the broker is down) also start a new
 * producer, whose initTransactions completes or aborts what the old one left. After every error
 * the consumer is rewound to the committed offsets. Prints "COMMITTED n" after each commit and
 * "DONE" once a commit leaves the group's offsets at the end of all N input records.
 */
public final class TransactionalCopier {
    private TransactionalCopier() {}

    private static final Duration POLL = Duration.ofMillis(200);
    private static final int ABORT_EVERY = 3;
    /** How long the copier keeps going before it gives up (the test has its own, shorter, bound). */
    private static final long RUN_MS_MAX = 600_000;

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = Check.args(argv);
        String bootstrap = args.get("bootstrap");
        String input = args.get("input");
        String output = args.get("output");
        String group = args.get("group");
        String transactionalId = args.get("transactional-id");
        long expect = Long.parseLong(args.get("expect"));

        Properties cc = new Properties();
        cc.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        cc.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        cc.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        cc.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        cc.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        cc.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "100");
        cc.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
        cc.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
        cc.put(ConsumerConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG, "500");
        cc.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        cc.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());

        long deadline = System.currentTimeMillis() + RUN_MS_MAX;
        long transactions = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(cc)) {
            consumer.subscribe(List.of(input));
            KafkaProducer<byte[], byte[]> producer = newProducer(bootstrap, transactionalId, deadline);
            while (System.currentTimeMillis() < deadline) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(POLL);
                if (records.isEmpty()) continue;
                boolean abort = ++transactions % ABORT_EVERY == 0;
                try {
                    producer.beginTransaction();
                    Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
                    for (ConsumerRecord<byte[], byte[]> r : records) {
                        byte[] value = (new String(r.value(), UTF_8) + "!").getBytes(UTF_8);
                        producer.send(new ProducerRecord<>(output, r.key(), value));
                        next.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                    }
                    producer.sendOffsetsToTransaction(next, consumer.groupMetadata());
                    if (abort) {
                        producer.flush();
                        producer.abortTransaction();
                        rewind(consumer);
                        continue;
                    }
                    producer.commitTransaction();
                    long committed = committedTotal(consumer, input);
                    System.out.println("COMMITTED " + committed);
                    if (committed >= expect) {
                        System.out.println("DONE");
                        producer.close(Duration.ofSeconds(5));
                        return;
                    }
                } catch (ProducerFencedException | OutOfOrderSequenceException | InvalidProducerEpochException
                        | AuthorizationException | UnsupportedVersionException
                        | org.apache.kafka.common.errors.TimeoutException e) {
                    log("new producer after " + e);
                    producer.close(Duration.ZERO);
                    producer = newProducer(bootstrap, transactionalId, deadline);
                    rewind(consumer);
                } catch (KafkaException e) {
                    log("aborting after " + e);
                    try {
                        producer.abortTransaction();
                    } catch (KafkaException again) {
                        log("new producer after a failed abort: " + again);
                        producer.close(Duration.ZERO);
                        producer = newProducer(bootstrap, transactionalId, deadline);
                    }
                    rewind(consumer);
                }
            }
        }
        System.err.println("FAIL: not done within " + RUN_MS_MAX + " ms");
        System.exit(1);
    }

    /** A transactional producer that completed initTransactions (retried while the broker is down). */
    private static KafkaProducer<byte[], byte[]> newProducer(String bootstrap, String transactionalId, long deadline) {
        Properties pc = new Properties();
        pc.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pc.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        pc.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        pc.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "10000");
        pc.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        pc.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        pc.put(ProducerConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG, "500");
        pc.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        pc.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        while (true) {
            KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pc);
            try {
                producer.initTransactions();
                return producer;
            } catch (KafkaException e) {
                producer.close(Duration.ZERO);
                if (System.currentTimeMillis() > deadline) throw e;
                log("initTransactions failed, retrying: " + e);
                sleep(200);
            }
        }
    }

    /** Seeks every assigned partition to the group's committed offset (the beginning if none). */
    private static void rewind(KafkaConsumer<byte[], byte[]> consumer) {
        while (true) {
            try {
                Set<TopicPartition> assigned = consumer.assignment();
                Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(assigned, Duration.ofSeconds(10));
                for (TopicPartition tp : assigned) {
                    OffsetAndMetadata c = committed.get(tp);
                    if (c == null) {
                        consumer.seekToBeginning(List.of(tp));
                    } else {
                        consumer.seek(tp, c.offset());
                    }
                }
                return;
            } catch (KafkaException e) {
                log("rewind failed, retrying: " + e);
                sleep(200);
            }
        }
    }

    /** The sum of the group's committed offsets over all partitions of `topic`; -1 if unknown now. */
    private static long committedTotal(KafkaConsumer<byte[], byte[]> consumer, String topic) {
        try {
            Set<TopicPartition> all = consumer.partitionsFor(topic).stream()
                    .map((PartitionInfo p) -> new TopicPartition(p.topic(), p.partition()))
                    .collect(Collectors.toSet());
            return consumer.committed(all, Duration.ofSeconds(10)).values().stream()
                    .mapToLong(c -> c == null ? 0 : c.offset())
                    .sum();
        } catch (KafkaException e) {
            log("reading the committed offsets failed: " + e);
            return -1;
        }
    }

    private static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new KafkaException(e);
        }
    }
}
