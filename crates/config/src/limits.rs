//! The named limits and defaults every queue, buffer and timing of the broker is bounded
//! by: one place to read what a setting defaults to and how far it may go, with the
//! measurements behind the values that were tuned.

/// Largest request frame accepted by default (Kafka's `socket.request.max.bytes`).
pub const REQUEST_BYTES_MAX_DEFAULT: usize = 100 * 1024 * 1024;
/// Connections open at once, broker-wide (Kafka's `max.connections`, unlimited there): with
/// the 64 KiB read buffer each, and `sasl.server.max.receive.size` each before
/// authentication, this bounds what connections alone can make the broker hold.
pub const CONNECTIONS_MAX_DEFAULT: usize = 10_000;
/// Kafka's default `max.connections.per.ip` (`Int.MaxValue`: no limit per address).
pub const CONNECTIONS_PER_IP_MAX_DEFAULT: usize = i32::MAX as usize;
/// Kafka's default `connections.max.idle.ms` (10 minutes): a connection with nothing in
/// flight that sends nothing for this long is closed.
pub const CONNECTIONS_MAX_IDLE_MS_DEFAULT: u64 = 600_000;
/// Kafka's default `connection.failed.authentication.delay.ms`: a failed SASL
/// authentication is answered (and its connection closed) only after this delay, so a
/// password guesser gets at most one attempt per connection per delay.
pub const CONNECTION_FAILED_AUTHENTICATION_DELAY_MS_DEFAULT: u64 = 100;
/// A request whose size prefix arrived must arrive whole within this long, or its
/// connection is closed and its memory charge released: a client that announces a large
/// request and trickles it (or sends nothing more) holds the shared budget no longer.
/// As Kafka's `request.timeout.ms` on the client side.
pub const REQUEST_READ_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// The shortest `request_read_timeout_ms` and `connections.max.idle.ms` accepted.
pub const CONNECTION_TIMEOUT_MS_MIN: u64 = 100;
/// Requests a connection may have in flight before the broker stops reading from it.
/// Most `io_threads` accepted: beyond this, threads only contend.
pub const IO_THREADS_MAX: usize = 256;

/// `io_threads` when it is 0: half the cores, at least one. Measured on 2 cores with the
/// clients on the same machine (README, "Benchmarks"): one worker took 20% less CPU at 10k
/// msg/s than two and kept 200k msg/s without a backlog, where two fell behind; workers
/// that park and wake each other cost more than they add once the cores are shared with
/// the WAL thread and the kernel's network and disk work.
pub fn io_threads_auto() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| cores.get() / 2).max(1)
}

/// `log_wal_round_interval_us` by default: 1.5 ms. At 10k msg/s of 1 KiB over 100
/// partitions (4 producers, `linger.ms=1`) the WAL ran 2,415 rounds a second; paced at
/// 1 ms, 1,011, and the broker took 0.31 cores instead of 0.43 (0.5 ms: 0.37; 2 ms: 0.24),
/// with publish p50 1.8 ms instead of 1.3 and p99 3.3 instead of 2.7 (2 ms: 4.3)
/// (`bench/results/2026-11-28/wal-round-interval-sweep`). Against 1 ms, 1.5 ms
/// gives 13% less broker CPU per GiB for 0.4 ms more publish p50 and 0.8 ms more p99
/// (`bench/results/2026-12-02/wal-round-interval`); 2 ms took 23% off but one of
/// its two runs had a p99 above 5 ms.
pub const WAL_ROUND_INTERVAL_US_DEFAULT: u64 = 1_500;
/// Most `log_wal_round_interval_us` accepted.
pub const WAL_ROUND_INTERVAL_US_MAX: u64 = sluice_storage::WAL_ROUND_INTERVAL_MAX.as_micros() as u64;

pub const INFLIGHT_REQUESTS_PER_CONNECTION_DEFAULT: usize = 16;
/// Request bytes admitted across all connections (Kafka's `queued.max.request.bytes`): a
/// request is charged its size as soon as its size prefix is read, before its body is, and
/// until its response is written. Bounds what all connections together buffer.
pub const QUEUED_MAX_REQUEST_BYTES_DEFAULT: usize = 512 * 1024 * 1024;
/// Of the broker-wide budget, this fraction (1/n) is kept from Produce requests for all
/// other requests: produce requests held while awaiting durability or replication must not
/// take the memory the followers' and consumers' fetches need to be read, or acks=all
/// produce would wait for fetches that wait for memory.
pub const QUEUED_REQUEST_BYTES_NON_PRODUCE_SHARE: usize = 8;
/// Request bytes one connection may have admitted (buffered and in flight) before the
/// broker stops reading from it. A request larger than this is still served, alone.
pub const QUEUED_MAX_REQUEST_BYTES_PER_CONNECTION_DEFAULT: usize = 64 * 1024 * 1024;
/// Kafka's default `sasl.server.max.receive.size`: the largest request a client may send on
/// a SASL listener before it has authenticated. Requests are charged to the memory budget
/// from their size prefix, so without it an anonymous client could hold
/// `max_request_bytes` of the budget per connection by sending 4 bytes.
pub const SASL_SERVER_MAX_RECEIVE_SIZE_DEFAULT: usize = 512 * 1024;
pub const PARTITIONS_PER_TOPIC_MAX: i32 = 100_000;
/// Longest a fetch may wait, whatever the client asks for.
pub const FETCH_WAIT_MS_MAX: i32 = 60_000;
/// Fetches whose data is not in the page cache, read at once on the blocking pool (broker
/// wide); the others wait. Each holds at most one fetch response's bytes. Cold reads go by direct
/// I/O in pieces as large as the WAL's recent rounds, 128 KiB to 1 MiB
/// (`sluice_storage::DIRECT_READ_PIECE_BYTES_MIN`): in 1 GiB cold
/// drains under a 256 MiB cap, one read at a time drained at 339 MB/s, two at 434-496 MB/s
/// with the producers' p99 5.9-9.0 ms during the drain, four at 496 MB/s with 9.5 ms; at
/// 320k msg/s (a peak trial) four kept the consumers near the producers' rate where one left
/// them 30-100 MB/s behind.
pub const FETCH_DISK_READS_MAX: usize = 2;
/// Bytes one fetch reads from the disk (a consumer or follower catching up asks for up to
/// `fetch.max.bytes`, 50 MiB by default; it gets the rest with its next fetch): this many of
/// the direct reads' pieces (`sluice_storage::direct_read_piece_bytes`), so 4 MiB
/// while the WAL's rounds are small and up to `FETCH_DISK_READ_BYTES_MAX` when they are large.
/// A cold fetch's turn costs the consumer a round trip and the blocking pool a hop: at 330k
/// msg/s consumers behind the tails' memory read 200-360 MB/s from the disk in
/// 4 MiB fetches and never caught up, and caught up (300-540 MB/s) in 16 MiB fetches of 1 MiB
/// pieces.
pub const FETCH_DISK_READ_PIECES: usize = 32;
/// The most one fetch reads from the disk: with `FETCH_DISK_READS_MAX`, the read buffers of
/// cold fetches stay under 32 MiB broker-wide, so a catch-up never makes producers' writes
/// wait for memory.
pub const FETCH_DISK_READ_BYTES_MAX: usize = 16 * 1024 * 1024;

/// What one cold fetch reads at most now (see `FETCH_DISK_READ_PIECES`).
pub fn fetch_disk_read_bytes() -> usize {
    (FETCH_DISK_READ_PIECES * sluice_storage::direct_read_piece_bytes()).min(FETCH_DISK_READ_BYTES_MAX)
}
// The smallest pieces make the smallest cold fetch, 4 MiB; the bound never cuts it.
const _: () = assert!(
    FETCH_DISK_READ_PIECES * sluice_storage::DIRECT_READ_PIECE_BYTES_MIN == 4 * 1024 * 1024
        && FETCH_DISK_READ_PIECES * sluice_storage::DIRECT_READ_PIECE_BYTES_MIN <= FETCH_DISK_READ_BYTES_MAX
);
/// Kafka's default `group.initial.rebalance.delay.ms`.
pub const GROUP_INITIAL_REBALANCE_DELAY_MS_DEFAULT: u64 = 3_000;
/// Longest initial rebalance delay accepted (it holds up every new group's first join).
pub const GROUP_INITIAL_REBALANCE_DELAY_MS_MAX: u64 = 300_000;
/// Kafka's default `group.consumer.heartbeat.interval.ms` (KIP-848 groups): the interval
/// the coordinator tells consumer-protocol members to heartbeat at.
pub const GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 5_000;
/// Kafka's default `group.consumer.session.timeout.ms`: a consumer-protocol member that
/// does not heartbeat for this long is removed and its partitions move.
pub const GROUP_CONSUMER_SESSION_TIMEOUT_MS_DEFAULT: u64 = 45_000;
/// Kafka's `offsets.topic.num.partitions`.
pub const OFFSETS_TOPIC_NUM_PARTITIONS_DEFAULT: i32 = 50;
/// Kafka's `group.share.record.lock.duration.ms`: how long a share consumer holds a record.
pub const GROUP_SHARE_RECORD_LOCK_DURATION_MS_DEFAULT: u64 = 30_000;
/// Kafka's `group.share.delivery.count.limit`: deliveries before a record is archived.
pub const GROUP_SHARE_DELIVERY_COUNT_LIMIT_DEFAULT: i16 = 5;
/// Kafka's `group.share.partition.max.record.locks`: records in flight per share-partition.
pub const GROUP_SHARE_PARTITION_MAX_RECORD_LOCKS_DEFAULT: usize = 2_000;
/// Kafka's `group.share.heartbeat.interval.ms`.
pub const GROUP_SHARE_HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 5_000;
/// Kafka's `group.share.session.timeout.ms`.
pub const GROUP_SHARE_SESSION_TIMEOUT_MS_DEFAULT: u64 = 45_000;
/// Kafka's `transaction.state.log.num.partitions`.
pub const TRANSACTION_STATE_NUM_PARTITIONS_DEFAULT: i32 = 50;
/// Kafka's `offsets.topic.segment.bytes` (100 MiB).
pub const OFFSETS_TOPIC_SEGMENT_BYTES_DEFAULT: u64 = 100 * 1024 * 1024;
pub const OFFSETS_TOPIC_SEGMENT_BYTES_MIN: u64 = 64 * 1024;
/// Kafka's `offsets.retention.minutes` (7 days).
pub const OFFSETS_RETENTION_MINUTES_DEFAULT: u64 = 7 * 24 * 60;
/// Kafka's `offsets.retention.check.interval.ms` (10 minutes).
pub const OFFSETS_RETENTION_CHECK_INTERVAL_MS_DEFAULT: u64 = 600_000;
/// Compaction snapshot interval: a partition's log holds at most about this much plus one
/// snapshot and one segment of superseded records.
pub const OFFSETS_SNAPSHOT_INTERVAL_BYTES_DEFAULT: u64 = 16 * 1024 * 1024;
pub const OFFSETS_SNAPSHOT_INTERVAL_BYTES_MIN: u64 = 4 * 1024;
/// Lower bounds well below Kafka's (which are 5 s and 45 s) so tests can run fast.
pub const GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS_MIN: u64 = 100;
pub const GROUP_CONSUMER_SESSION_TIMEOUT_MS_MIN: u64 = 1_000;
/// Upper bound of both consumer-group timings (Kafka's `group.max.session.timeout.ms`).
pub const GROUP_CONSUMER_TIMEOUT_MS_MAX: u64 = 1_800_000;

const _: () = assert!(GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS_DEFAULT < GROUP_CONSUMER_SESSION_TIMEOUT_MS_DEFAULT);
const _: () = assert!(GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS_MIN < GROUP_CONSUMER_SESSION_TIMEOUT_MS_MIN);
