package sluice.tests;

import static java.nio.charset.StandardCharsets.US_ASCII;
import static sluice.tests.Check.check;
import static sluice.tests.Check.checkEq;
import static sluice.tests.Check.fail;
import static sluice.tests.Check.log;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Reads a tiered topic's (remote.storage.enable=true) whole history back with the Java consumer.
 *
 * <pre>
 * --bootstrap HOST:PORT --topic T --partitions N --records R
 * </pre>
 *
 * Assigns every partition (no group), checks beginningOffsets = 0 (the remote tier's start) and
 * endOffsets = R, seeks to the beginning and polls until offsets 0..R-1 of every partition have
 * arrived: dense (no gap, no duplicate, nothing beyond R-1) and each value byte for byte equal to
 * value(p, n) = ASCII "%d:%08d" % (p, n) followed by 't' * (10000 - 11) bytes (value() in
 * tests/python/test_tiered_storage.py). auto.offset.reset=none, so an OffsetOutOfRange answer
 * for an offset that only the remote tier holds fails the run instead of silently resetting.
 * Everything must finish within 120 s.
 *
 * Prints "consumed and verified X records" and "PASS tiered"; on any mismatch prints
 * "FAIL: ..." to stderr and exits non-zero.
 */
public final class TieredReader {
    private TieredReader() {}

    static final int RECORD_BYTES = 10_000;
    static final long TIMEOUT_NS = 120_000_000_000L;

    public static void main(String[] argv) {
        int rc = 0;
        try {
            Map<String, String> a = Check.args(argv);
            read(Check.req(a, "bootstrap"), Check.req(a, "topic"), Integer.parseInt(Check.req(a, "partitions")),
                    Long.parseLong(Check.req(a, "records")));
            log("PASS tiered");
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

    static KafkaConsumer<byte[], byte[]> consumer(String bootstrap) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "tiered-reader");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none");
        p.put(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        return new KafkaConsumer<>(p);
    }

    /** The record written at offset n of partition p (value() in test_tiered_storage.py). */
    static byte[] value(int p, long n) {
        byte[] prefix = String.format("%d:%08d", p, n).getBytes(US_ASCII);
        byte[] b = Arrays.copyOf(prefix, prefix.length + RECORD_BYTES - 11);
        Arrays.fill(b, prefix.length, b.length, (byte) 't');
        return b;
    }

    static String show(byte[] b) {
        if (b == null) return "null";
        int n = Math.min(b.length, 24);
        return b.length + " bytes starting \"" + new String(b, 0, n, US_ASCII) + (b.length > n ? "...\"" : "\"");
    }

    static void read(String bootstrap, String topic, int partitions, long records) {
        long t0 = System.nanoTime();
        long deadline = t0 + TIMEOUT_NS;
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < partitions; p++) tps.add(new TopicPartition(topic, p));
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(bootstrap)) {
            // Assigned first: offset lookups for unassigned partitions make the client log warnings.
            consumer.assign(tps);
            Map<TopicPartition, Long> begin = consumer.beginningOffsets(tps, Duration.ofSeconds(30));
            Map<TopicPartition, Long> end = consumer.endOffsets(tps, Duration.ofSeconds(30));
            for (TopicPartition tp : tps) {
                checkEq(0L, begin.get(tp), "beginningOffsets " + tp + " (the remote tier's start)");
                checkEq(records, end.get(tp), "endOffsets " + tp);
            }
            log("beginningOffsets all 0, endOffsets all " + records);

            consumer.seekToBeginning(tps);
            long[] next = new long[partitions];
            long total = 0;
            long want = records * partitions;
            long lastReport = t0;
            while (total < want) {
                long now = System.nanoTime();
                if (now > deadline) {
                    fail("consumed only " + total + " of " + want + " records within " + TIMEOUT_NS / 1_000_000_000L
                            + " s; next offset per partition: " + Arrays.toString(next));
                }
                if (now - lastReport > 10_000_000_000L) {
                    log("progress: next offset per partition " + Arrays.toString(next));
                    lastReport = now;
                }
                ConsumerRecords<byte[], byte[]> recs = consumer.poll(Duration.ofMillis(500));
                for (ConsumerRecord<byte[], byte[]> r : recs) {
                    int p = r.partition();
                    String where = topic + "-" + p + "@" + r.offset();
                    check(r.topic().equals(topic) && p >= 0 && p < partitions, "record from an unassigned partition: " + where);
                    if (r.offset() != next[p]) {
                        fail(where + ": expected offset " + next[p] + " next ("
                                + (r.offset() < next[p] ? "duplicate / went backwards" : "gap of " + (r.offset() - next[p]))
                                + ")");
                    }
                    check(r.offset() < records, where + ": beyond the " + records + " records produced");
                    byte[] expected = value(p, r.offset());
                    if (!Arrays.equals(expected, r.value())) {
                        int at = r.value() == null ? 0 : Arrays.mismatch(expected, r.value());
                        fail(where + ": value differs from byte " + at + ": expected " + show(expected) + ", got "
                                + show(r.value()));
                    }
                    next[p]++;
                    total++;
                }
            }
            for (TopicPartition tp : tps) {
                checkEq(records, consumer.position(tp, Duration.ofSeconds(30)), "position " + tp + " after the read");
            }
            long ms = (System.nanoTime() - t0) / 1_000_000;
            log("consumed and verified " + total + " records in " + ms + " ms");
        }
    }
}
