//! Lag and rate over time: every sample interval the console asks the cluster for each
//! partition's end offset and each group's positions, and keeps per group its total lag and
//! per topic its end offsets' sum (messages per second are the differences), in memory.
//!
//! Why the console keeps them: Kafka only says where things are now, and an operator asks
//! "since when has this group fallen behind?". Each series is bounded: the last hour at the
//! sample interval ([`RECENT_POINTS`]) and the last day at every [`DAY_EVERY`]th sample
//! ([`DAY_POINTS`]), for at most [`SERIES_MAX`] series, so memory stays bounded whatever the
//! cluster holds (about 5 KiB a series). A series whose group or topic is gone is dropped.
//!
//! The sampler asks as the console's own identity (anonymous without logins, else the
//! brokers' own user), so it sees every group and topic; pages show a series only to a user
//! whose own request for that group or topic the broker allowed.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::anyhow;
use kafka_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup;
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
use kafka_protocol::messages::{DescribeShareGroupOffsetsRequest, FindCoordinatorRequest, GroupId, OffsetFetchRequest};
use kafka_protocol::protocol::StrBytes;
use parking_lot::Mutex;

use crate::cluster::{versions, ClusterClient};
use crate::node_load::{self, NodeSample, NodeTotals, NodeTotalsSource};

/// Opens the sampler's client of the cluster.
pub type ClientOpener =
    Box<dyn Fn() -> futures::future::BoxFuture<'static, anyhow::Result<Arc<ClusterClient>>> + Send + Sync>;
use crate::groups::group_rows;
use crate::topics::{offsets, LATEST};

/// The shortest sample interval (the default is 10 s).
pub const HISTORY_INTERVAL_MIN: Duration = Duration::from_millis(500);
/// Points of the last hour at the default interval.
pub const RECENT_POINTS: usize = 360;
/// Every this many samples one joins the day's series (5 minutes at the default interval).
pub const DAY_EVERY: u64 = 30;
/// Points of the day's series.
pub const DAY_POINTS: usize = 288;
/// Series kept at most (groups and topics); more are left out until others go.
pub const SERIES_MAX: usize = 10_000;
/// Groups asked for their positions in one OffsetFetch.
const GROUPS_PER_REQUEST: usize = 100;
/// FindCoordinator's key type of a group.
const GROUP_KEY: i8 = 0;

/// What a series measures.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SeriesKey {
    /// A group's lag summed over its partitions.
    GroupLag(String),
    /// A topic's end offsets summed over its partitions.
    TopicEnd(String),
    /// Bytes produced to this node since it started.
    NodeBytesIn,
    /// Bytes fetched from this node since it started.
    NodeBytesOut,
    /// This node's request latency percentile over each interval (`node_load`), in
    /// microseconds, by API; a point only for an interval that served a request.
    RequestLatency(String),
}

impl SeriesKey {
    /// Whether the series is this node's own, kept whether or not the cluster answered.
    fn is_node(&self) -> bool {
        matches!(self, SeriesKey::NodeBytesIn | SeriesKey::NodeBytesOut | SeriesKey::RequestLatency(_))
    }
}

/// One sample of a series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// Milliseconds since the epoch.
    pub at_ms: i64,
    pub value: i64,
}

/// Which stretch of a series a chart shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// The recent points (an hour at the default interval).
    Recent,
    /// The day's points.
    Day,
}

impl Window {
    pub fn parse(text: Option<&str>) -> Window {
        match text {
            Some("24h") => Window::Day,
            _ => Window::Recent,
        }
    }
}

#[derive(Default)]
struct Series {
    recent: VecDeque<Point>,
    day: VecDeque<Point>,
}

impl Series {
    fn push(&mut self, point: Point, into_day: bool) {
        push_bounded(&mut self.recent, point, RECENT_POINTS);
        if into_day {
            push_bounded(&mut self.day, point, DAY_POINTS);
        }
    }
}

fn push_bounded(points: &mut VecDeque<Point>, point: Point, max: usize) {
    if points.len() == max {
        points.pop_front();
    }
    points.push_back(point);
    assert!(points.len() <= max);
}

/// The series kept, and how sampling goes.
pub struct History {
    pub interval: Duration,
    series: Mutex<HashMap<SeriesKey, Series>>,
    samples: Mutex<u64>,
    /// Why the last sample failed, if it did.
    last_error: Mutex<Option<String>>,
}

impl History {
    pub fn new(interval: Duration) -> History {
        History { interval, series: Mutex::default(), samples: Mutex::new(0), last_error: Mutex::default() }
    }

    /// Adds one sample of every series at `at_ms`. With `cluster_answered`, a group's or
    /// topic's series not in `values` is gone and dropped; without (the cluster's part of
    /// the sample failed), every series is kept.
    pub fn record(&self, at_ms: i64, values: BTreeMap<SeriesKey, i64>, cluster_answered: bool) {
        let into_day = {
            let mut samples = self.samples.lock();
            *samples += 1;
            (*samples - 1) % DAY_EVERY == 0
        };
        let mut series = self.series.lock();
        if cluster_answered {
            series.retain(|key, _| key.is_node() || values.contains_key(key));
        }
        for (key, value) in values {
            if series.len() >= SERIES_MAX && !series.contains_key(&key) {
                continue;
            }
            series.entry(key).or_default().push(Point { at_ms, value }, into_day);
        }
        assert!(series.len() <= SERIES_MAX);
    }

    /// The points of one series in `window`, oldest first.
    pub fn points(&self, key: &SeriesKey, window: Window) -> Vec<Point> {
        let series = self.series.lock();
        let Some(found) = series.get(key) else { return Vec::new() };
        match window {
            Window::Recent => found.recent.iter().copied().collect(),
            Window::Day => found.day.iter().copied().collect(),
        }
    }

    /// Messages per second into `topics` together, between consecutive samples in `window`.
    pub fn rate(&self, topics: &[String], window: Window) -> Vec<Point> {
        let mut totals: BTreeMap<i64, i64> = BTreeMap::new();
        for topic in topics {
            for point in self.points(&SeriesKey::TopicEnd(topic.clone()), window) {
                *totals.entry(point.at_ms).or_default() += point.value;
            }
        }
        let totals: Vec<Point> = totals.into_iter().map(|(at_ms, value)| Point { at_ms, value }).collect();
        rates(&totals)
    }

    /// Per-second growth of a series of totals (this node's bytes in or out).
    pub fn growth(&self, key: &SeriesKey, window: Window) -> Vec<Point> {
        rates(&self.points(key, window))
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }
}

/// Per-second differences of a growing total (a total that shrank, e.g. a topic deleted and
/// made again, counts as no growth).
pub fn rates(totals: &[Point]) -> Vec<Point> {
    totals
        .windows(2)
        .filter(|pair| pair[1].at_ms > pair[0].at_ms)
        .map(|pair| {
            let grown = (pair[1].value - pair[0].value).max(0);
            let elapsed_ms = pair[1].at_ms - pair[0].at_ms;
            Point { at_ms: pair[1].at_ms, value: grown * 1000 / elapsed_ms }
        })
        .collect()
}

/// Samples the cluster every `history.interval` for as long as the console runs, as the
/// client `connect` opens (again after a failure; `None`: nobody to sample as), and this
/// node's own totals from `node`.
pub async fn run(history: Arc<History>, connect: Option<ClientOpener>, node: Option<NodeTotalsSource>) {
    if connect.is_none() {
        *history.last_error.lock() = Some("no user to sample as: history needs the cluster's shared secret".into());
    }
    let mut ticks = tokio::time::interval(history.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client = None;
    let mut node_before: Option<NodeTotals> = None;
    loop {
        ticks.tick().await;
        let mut values = BTreeMap::new();
        if let Some(node) = &node {
            let totals = node();
            values.extend(node_values(node_load::sample(node_before.as_ref(), &totals)));
            node_before = Some(totals);
        }
        let Some(connect) = &connect else {
            history.record(now_ms(), values, false);
            continue;
        };
        let cluster = match sample_cluster(&mut client, connect).await {
            Ok(cluster) => cluster,
            Err(error) => {
                tracing::debug!(error = %format!("{error:#}"), "console history sample failed");
                *history.last_error.lock() = Some(format!("{error:#}"));
                history.record(now_ms(), values, false);
                continue;
            }
        };
        values.extend(cluster);
        history.record(now_ms(), values, true);
        *history.last_error.lock() = None;
    }
}

/// The series of one sample of this node.
fn node_values(sample: NodeSample) -> Vec<(SeriesKey, i64)> {
    let mut values =
        vec![(SeriesKey::NodeBytesIn, sample.produced_bytes), (SeriesKey::NodeBytesOut, sample.fetched_bytes)];
    values
        .extend(sample.latency_micros.into_iter().map(|(api, micros)| (SeriesKey::RequestLatency(api.into()), micros)));
    values
}

/// The cluster's part of one sample, over `client` (opened first if it is not; forgotten
/// after a failure, so the next sample opens another).
async fn sample_cluster(
    client: &mut Option<Arc<ClusterClient>>,
    connect: &ClientOpener,
) -> anyhow::Result<BTreeMap<SeriesKey, i64>> {
    let opened = match client.take() {
        Some(opened) => opened,
        None => connect().await?,
    };
    let values = sample(&opened).await?;
    *client = Some(opened);
    Ok(values)
}

fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// One sample: each topic's end-offset sum and each group's lag.
async fn sample(client: &Arc<ClusterClient>) -> anyhow::Result<BTreeMap<SeriesKey, i64>> {
    let metadata = client.metadata(None).await?;
    let ends = offsets(client, &metadata, LATEST).await?;
    let mut values = BTreeMap::new();
    for ((topic, _), end) in &ends {
        *values.entry(SeriesKey::TopicEnd(topic.clone())).or_default() += end;
    }
    let groups = group_rows(client, &metadata).await?;
    let (share, others): (Vec<_>, Vec<_>) = groups.into_iter().partition(|g| g.kind == "share");
    let coordinators = coordinators(client, others.iter().chain(&share).map(|g| g.id.as_str())).await?;
    let mut positions = committed(client, &coordinators, others.iter().map(|g| g.id.as_str())).await?;
    positions.extend(share_starts(client, &coordinators, share.iter().map(|g| g.id.as_str())).await?);
    for (group, by_partition) in positions {
        let lag = by_partition.iter().filter_map(|(key, position)| Some((ends.get(key)? - position).max(0))).sum();
        values.insert(SeriesKey::GroupLag(group), lag);
    }
    Ok(values)
}

type Positions = HashMap<String, Vec<((String, i32), i64)>>;

/// Each group's coordinator address, asked in one FindCoordinator.
async fn coordinators<'a>(
    client: &Arc<ClusterClient>,
    groups: impl Iterator<Item = &'a str>,
) -> anyhow::Result<HashMap<String, String>> {
    let keys: Vec<StrBytes> = groups.map(|g| StrBytes::from_string(g.to_string())).collect();
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    let mut request = FindCoordinatorRequest::default();
    request.key_type = GROUP_KEY;
    request.coordinator_keys = keys;
    let bootstrap = client.bootstrap().to_string();
    let answer = client.send(&bootstrap, versions::FIND_COORDINATOR, request).await?;
    Ok(answer
        .coordinators
        .into_iter()
        .filter(|c| c.error_code == 0)
        .map(|c| (c.key.to_string(), format!("{}:{}", c.host, c.port)))
        .collect())
}

/// Committed offsets of classic and consumer groups, [`GROUPS_PER_REQUEST`] per request to
/// each coordinator.
async fn committed<'a>(
    client: &Arc<ClusterClient>,
    coordinators: &HashMap<String, String>,
    groups: impl Iterator<Item = &'a str>,
) -> anyhow::Result<Positions> {
    let mut by_coordinator: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for group in groups {
        if let Some(address) = coordinators.get(group) {
            by_coordinator.entry(address).or_default().push(group);
        }
    }
    let mut found = Positions::new();
    for (address, groups) in by_coordinator {
        for chunk in groups.chunks(GROUPS_PER_REQUEST) {
            let mut request = OffsetFetchRequest::default();
            request.groups = chunk
                .iter()
                .map(|id| {
                    let mut group = OffsetFetchRequestGroup::default();
                    group.group_id = GroupId(StrBytes::from_string(id.to_string()));
                    group.topics = None;
                    group.member_epoch = -1;
                    group
                })
                .collect();
            let answer = client.send(address, versions::OFFSET_FETCH, request).await?;
            for group in answer.groups.into_iter().filter(|g| g.error_code == 0) {
                let positions = found.entry(group.group_id.to_string()).or_default();
                for topic in group.topics {
                    let name = topic.name.to_string();
                    for partition in topic.partitions.into_iter().filter(|p| p.committed_offset >= 0) {
                        positions.push(((name.clone(), partition.partition_index), partition.committed_offset));
                    }
                }
            }
        }
    }
    Ok(found)
}

/// Start offsets of share groups, one request per group.
async fn share_starts<'a>(
    client: &Arc<ClusterClient>,
    coordinators: &HashMap<String, String>,
    groups: impl Iterator<Item = &'a str>,
) -> anyhow::Result<Positions> {
    let mut found = Positions::new();
    for id in groups {
        let Some(address) = coordinators.get(id) else { continue };
        let mut group = DescribeShareGroupOffsetsRequestGroup::default();
        group.group_id = GroupId(StrBytes::from_string(id.to_string()));
        group.topics = None;
        let mut request = DescribeShareGroupOffsetsRequest::default();
        request.groups = vec![group];
        let answer = client.send(address, versions::DESCRIBE_SHARE_GROUP_OFFSETS, request).await?;
        let group = answer.groups.into_iter().next().ok_or_else(|| anyhow!("no DescribeShareGroupOffsets answer"))?;
        if group.error_code != 0 {
            continue;
        }
        let positions = found.entry(id.to_string()).or_default();
        for topic in group.topics {
            let name = topic.topic_name.to_string();
            for partition in topic.partitions.into_iter().filter(|p| p.start_offset >= 0) {
                positions.push(((name.clone(), partition.partition_index), partition.start_offset));
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(SeriesKey, i64)]) -> BTreeMap<SeriesKey, i64> {
        pairs.iter().cloned().collect()
    }

    #[test]
    fn series_are_bounded_and_dropped_with_their_group() {
        let history = History::new(Duration::from_secs(10));
        let lag = SeriesKey::GroupLag("g".into());
        for i in 0..(RECENT_POINTS as i64 + 5) {
            history.record(i * 10_000, values(&[(lag.clone(), i)]), true);
        }
        let recent = history.points(&lag, Window::Recent);
        assert_eq!(recent.len(), RECENT_POINTS);
        assert_eq!(recent.last().unwrap().value, RECENT_POINTS as i64 + 4);
        // Every DAY_EVERYth sample, from the first.
        let day = history.points(&lag, Window::Day);
        assert_eq!(day.len(), (RECENT_POINTS + 5).div_ceil(DAY_EVERY as usize));
        assert_eq!(day[1].value, DAY_EVERY as i64);
        history.record(1, values(&[(SeriesKey::TopicEnd("t".into()), 1)]), false);
        assert!(!history.points(&lag, Window::Recent).is_empty(), "a failed cluster sample dropped a series");
        history.record(1, values(&[(SeriesKey::TopicEnd("t".into()), 1)]), true);
        assert!(history.points(&lag, Window::Recent).is_empty(), "a gone group's series stays");
    }

    #[test]
    fn a_nodes_series_outlive_samples_that_leave_them_out() {
        let history = History::new(Duration::from_secs(1));
        let latency = SeriesKey::RequestLatency("Produce".into());
        history.record(0, values(&[(latency.clone(), 900), (SeriesKey::NodeBytesIn, 0)]), true);
        history.record(1000, values(&[(SeriesKey::NodeBytesIn, 4096)]), true);
        assert_eq!(history.points(&latency, Window::Recent).len(), 1, "an idle interval dropped the latency series");
        assert_eq!(history.growth(&SeriesKey::NodeBytesIn, Window::Recent), vec![Point { at_ms: 1000, value: 4096 }]);
    }

    #[test]
    fn rates_are_per_second_and_never_negative() {
        let totals =
            [Point { at_ms: 0, value: 0 }, Point { at_ms: 10_000, value: 500 }, Point { at_ms: 20_000, value: 100 }];
        assert_eq!(rates(&totals), vec![Point { at_ms: 10_000, value: 50 }, Point { at_ms: 20_000, value: 0 }]);
        let history = History::new(Duration::from_secs(1));
        for (at_ms, a, b) in [(0, 0, 0), (1000, 10, 5)] {
            let sample = values(&[(SeriesKey::TopicEnd("a".into()), a), (SeriesKey::TopicEnd("b".into()), b)]);
            history.record(at_ms, sample, true);
        }
        let both = history.rate(&["a".to_string(), "b".to_string()], Window::Recent);
        assert_eq!(both, vec![Point { at_ms: 1000, value: 15 }]);
    }
}
