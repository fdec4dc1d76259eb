package sluice.tests;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.stream.Collectors;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * One long-running group member (the Java consumer), driven by a test over stdin/stdout so
 * that a test can run several in separate JVMs and SIGKILL one of them.
 *
 * <p>stdout, one event per line, each with the wall-clock time in ms:
 * <ul>
 *   <li>{@code STARTED <ms>} once subscribed;</li>
 *   <li>{@code ASSIGNED <ms> <p,p,..>} whenever the owned set changes (after the callbacks);</li>
 *   <li>{@code REVOKED <ms> <p,..>} / {@code LOST <ms> <p,..>} / {@code ADDED <ms> <p,..>} from the
 *       ConsumerRebalanceListener (with the consumer protocol only what moves is revoked);</li>
 *   <li>{@code FIRST <ms> <p>} the first record of a partition after it was (re)assigned;</li>
 *   <li>{@code RECORD <p> <offset> <value>} for every record with --print-records;</li>
 *   <li>{@code COMMITTED <ms> <p:offset,..>} after the stdin command {@code commit};</li>
 *   <li>{@code CLOSED <ms>} after the stdin command {@code close} (then it exits 0).</li>
 * </ul>
 *
 * <p>Arguments: --bootstrap, --group, --topic, --protocol classic|consumer, optional
 * --instance-id, --client-id, --print-records, --props "k=v;k=v" (more consumer configs).
 */
public final class GroupMember {
    private GroupMember() {}

    private static synchronized void emit(String line) {
        System.out.println(line);
        System.out.flush();
    }

    private static String partitions(Collection<TopicPartition> tps) {
        return tps.stream().map(TopicPartition::partition).sorted().map(String::valueOf).collect(Collectors.joining(","));
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> opts = Check.args(args);
        String topic = Check.req(opts, "topic");
        boolean printRecords = opts.containsKey("print-records");
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, Check.req(opts, "bootstrap"));
        props.put(ConsumerConfig.GROUP_ID_CONFIG, Check.req(opts, "group"));
        props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, opts.getOrDefault("protocol", "consumer"));
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        if (opts.containsKey("instance-id")) props.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, opts.get("instance-id"));
        if (opts.containsKey("client-id")) props.put(ConsumerConfig.CLIENT_ID_CONFIG, opts.get("client-id"));
        for (String extra : opts.getOrDefault("props", "").split(";")) {
            if (extra.contains("=")) props.put(extra.substring(0, extra.indexOf('=')), extra.substring(extra.indexOf('=') + 1));
        }

        LinkedBlockingQueue<String> commands = new LinkedBlockingQueue<>();
        Thread stdin = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                for (String line; (line = in.readLine()) != null; ) commands.add(line.trim());
            } catch (Exception e) {
                commands.add("close");
            }
        }, "stdin");
        stdin.setDaemon(true);
        stdin.start();

        Set<Integer> unseen = new HashSet<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> tps) {
                    if (!tps.isEmpty()) emit("REVOKED " + System.currentTimeMillis() + " " + partitions(tps));
                }

                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> tps) {
                    if (!tps.isEmpty()) emit("ADDED " + System.currentTimeMillis() + " " + partitions(tps));
                    for (TopicPartition tp : tps) unseen.add(tp.partition());
                }

                @Override
                public void onPartitionsLost(Collection<TopicPartition> tps) {
                    if (!tps.isEmpty()) emit("LOST " + System.currentTimeMillis() + " " + partitions(tps));
                }
            });
            emit("STARTED " + System.currentTimeMillis());
            String last = null;
            while (true) {
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(50))) {
                    if (unseen.remove(record.partition())) {
                        emit("FIRST " + System.currentTimeMillis() + " " + record.partition());
                    }
                    if (printRecords) {
                        String value = record.value() == null ? "" : new String(record.value(), StandardCharsets.UTF_8);
                        emit("RECORD " + record.partition() + " " + record.offset() + " " + value);
                    }
                }
                String now = partitions(consumer.assignment());
                if (!now.equals(last)) {
                    emit("ASSIGNED " + System.currentTimeMillis() + " " + now);
                    last = now;
                }
                String command = commands.poll();
                if (command == null) continue;
                if (command.equals("commit")) {
                    Map<TopicPartition, OffsetAndMetadata> positions = new HashMap<>();
                    for (TopicPartition tp : consumer.assignment()) {
                        positions.put(tp, new OffsetAndMetadata(consumer.position(tp)));
                    }
                    consumer.commitSync(positions);
                    List<String> committed = new ArrayList<>();
                    new TreeMap<Integer, Long>(positions.entrySet().stream().collect(Collectors.toMap(
                            e -> e.getKey().partition(), e -> e.getValue().offset())))
                            .forEach((partition, offset) -> committed.add(partition + ":" + offset));
                    emit("COMMITTED " + System.currentTimeMillis() + " " + String.join(",", committed));
                } else if (command.equals("close")) {
                    break;
                }
            }
        }
        emit("CLOSED " + System.currentTimeMillis());
    }
}
