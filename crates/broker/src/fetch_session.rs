//! Fetch sessions (KIP-227): a client that fetches many partitions sends the whole list once;
//! later fetches carry only the partitions whose fetch position changed (and those to
//! forget), and the answer only the partitions with news: records, an error, or a moved
//! high watermark, log start or last stable offset. A consumer of thousands of partitions
//! then costs per fetch what its traffic costs, not what its assignment costs.
//!
//! The protocol, as the broker sees it (`session_id`, `session_epoch` in the request):
//! - epoch -1: a full fetch outside any session (librdkafka, our own replica fetcher); a
//!   session id given with it is closed;
//! - epoch 0: a full fetch that opens a new session (closing the one named, if any); the
//!   answer carries the new id, or 0 when the cache has no room (the client goes on with
//!   full fetches);
//! - epoch n > 0: an incremental fetch on session `session_id`, which must expect exactly
//!   epoch n (FETCH_SESSION_ID_NOT_FOUND / INVALID_FETCH_SESSION_EPOCH otherwise; the client
//!   then opens a new session).
//!
//! Sessions live in the broker, not the connection (a client may reconnect and go on), at
//! most [`FETCH_SESSIONS_MAX`] at once (Kafka's `max.incremental.fetch.session.cache.slots`).
//! When full, a new session takes the place of the least recently used one if that one has
//! been idle for [`FETCH_SESSION_EVICTION_MS`] or has fewer partitions, else it is not
//! created. Partitions that returned records move to the end of their session's order, so a
//! response limit cannot starve the partitions behind them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use indexmap::IndexMap;
use kafka_protocol::messages::fetch_request::FetchPartition;
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::{FetchRequest, TopicName};
use kafka_protocol::ResponseError;
use parking_lot::Mutex;
use uuid::Uuid;

/// Sessions cached at once (Kafka's `max.incremental.fetch.session.cache.slots` default).
pub const FETCH_SESSIONS_MAX: usize = 1_000;
/// A session idle this long may be evicted for a new one (Kafka's
/// `min.incremental.fetch.session.eviction.ms` default).
pub const FETCH_SESSION_EVICTION_MS: u64 = 120_000;
/// Partitions one session may hold (a full fetch of more is served without a session).
pub const FETCH_SESSION_PARTITIONS_MAX: usize = 100_000;

const FINAL_EPOCH: i32 = -1;
const INITIAL_EPOCH: i32 = 0;

/// A partition as a fetch names it: topic id (v13+) or name (earlier), and index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PartitionKey {
    topic_id: Uuid,
    topic: TopicName,
    partition: i32,
}

/// One partition a fetch reads: where its topic is named and what the client asked.
#[derive(Debug, Clone)]
pub(crate) struct FetchItem {
    pub(crate) topic: TopicName,
    pub(crate) topic_id: Uuid,
    pub(crate) partition: FetchPartition,
}

impl FetchItem {
    /// Whether `other` names the same topic. Items of one topic usually share the name's
    /// bytes (decoded once per topic), so the pointer is compared before the text.
    pub(crate) fn same_topic(&self, other: &FetchItem) -> bool {
        let (mine, theirs) = (self.topic.as_str(), other.topic.as_str());
        self.topic_id == other.topic_id
            && (std::ptr::eq(mine.as_ptr(), theirs.as_ptr()) && mine.len() == theirs.len() || mine == theirs)
    }

    fn key(&self) -> PartitionKey {
        PartitionKey { topic_id: self.topic_id, topic: self.topic.clone(), partition: self.partition.partition }
    }
}

/// What the session remembers of a partition: the client's last request for it and what
/// the last answer told the client.
#[derive(Debug)]
struct CachedPartition {
    item: FetchItem,
    /// (high watermark, last stable offset, log start) last sent; `None` before any answer.
    last_sent: Option<(i64, i64, i64)>,
    /// Returned records in the answer being recorded: moves to the end of the order.
    had_records: bool,
}

#[derive(Debug)]
struct FetchSession {
    partitions: IndexMap<PartitionKey, CachedPartition>,
    /// The epoch the next incremental fetch must carry.
    next_epoch: i32,
    last_used: Instant,
    /// Counts the fetches begun on this session: `finish` finds the partitions of the fetch
    /// it records by their place in the order only if no other fetch changed it since.
    generation: u64,
}

/// How a fetch relates to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FetchSessionUse {
    /// A full fetch with no session (answer session id 0, every partition).
    None,
    /// A full fetch that opened session `id` (answer every partition).
    Opened { id: i32 },
    /// An incremental fetch on session `id` at `generation` (answer only partitions with
    /// news).
    Incremental { id: i32, generation: u64 },
}

impl FetchSessionUse {
    /// The session id to answer with.
    pub(crate) fn id(self) -> i32 {
        match self {
            FetchSessionUse::None => 0,
            FetchSessionUse::Opened { id } | FetchSessionUse::Incremental { id, .. } => id,
        }
    }
}

/// The broker's fetch-session cache.
#[derive(Default)]
pub(crate) struct FetchSessions {
    sessions: Mutex<HashMap<i32, FetchSession>>,
}

impl FetchSessions {
    /// Applies a fetch request to the cache: returns how the fetch uses a session and every
    /// partition it reads, in order, or the session error to answer with.
    pub(crate) fn begin(&self, request: FetchRequest) -> Result<(FetchSessionUse, Vec<FetchItem>), ResponseError> {
        let FetchRequest { session_id, session_epoch, topics, forgotten_topics_data, .. } = request;
        let requested = || -> Vec<FetchItem> {
            topics
                .into_iter()
                .flat_map(|topic| {
                    let (name, topic_id) = (topic.topic, topic.topic_id);
                    topic.partitions.into_iter().map(move |partition| FetchItem {
                        topic: name.clone(),
                        topic_id,
                        partition,
                    })
                })
                .collect()
        };
        let mut sessions = self.sessions.lock();
        match session_epoch {
            FINAL_EPOCH | INITIAL_EPOCH => {
                if session_id != 0 {
                    sessions.remove(&session_id);
                }
                let items = requested();
                if session_epoch == FINAL_EPOCH {
                    return Ok((FetchSessionUse::None, items));
                }
                let id = open(&mut sessions, &items);
                Ok((id.map_or(FetchSessionUse::None, |id| FetchSessionUse::Opened { id }), items))
            }
            epoch if epoch > 0 => {
                let session = sessions.get_mut(&session_id).ok_or(ResponseError::FetchSessionIdNotFound)?;
                if epoch != session.next_epoch {
                    return Err(ResponseError::InvalidFetchSessionEpoch);
                }
                let requested = requested();
                let added = requested.iter().filter(|item| !session.partitions.contains_key(&item.key())).count();
                if session.partitions.len() + added > FETCH_SESSION_PARTITIONS_MAX {
                    return Err(ResponseError::InvalidRequest);
                }
                for item in requested {
                    let item_key = item.key();
                    match session.partitions.get_mut(&item_key) {
                        Some(cached) => cached.item = item,
                        None => {
                            let cached = CachedPartition { item, last_sent: None, had_records: false };
                            session.partitions.insert(item_key, cached);
                        }
                    }
                }
                for forgotten in &forgotten_topics_data {
                    for &partition in &forgotten.partitions {
                        let key =
                            PartitionKey { topic_id: forgotten.topic_id, topic: forgotten.topic.clone(), partition };
                        session.partitions.shift_remove(&key);
                    }
                }
                session.next_epoch = if epoch == i32::MAX { 1 } else { epoch + 1 };
                session.last_used = Instant::now();
                session.generation += 1;
                let items = session.partitions.values().map(|cached| cached.item.clone()).collect();
                Ok((FetchSessionUse::Incremental { id: session_id, generation: session.generation }, items))
            }
            _ => Err(ResponseError::InvalidFetchSessionEpoch),
        }
    }

    /// Records what the answer tells the client and picks what it must carry: every
    /// partition of a full fetch, only those with news on an incremental one. `answered`
    /// holds each read partition's data, in the order `begin` returned them.
    pub(crate) fn finish(
        &self,
        session: FetchSessionUse,
        items: Vec<FetchItem>,
        answered: Vec<PartitionData>,
    ) -> Vec<(FetchItem, PartitionData)> {
        assert_eq!(items.len(), answered.len(), "one answer per partition read");
        let (id, incremental) = match session {
            FetchSessionUse::None => return items.into_iter().zip(answered).collect(),
            FetchSessionUse::Opened { id } => (id, None),
            FetchSessionUse::Incremental { id, generation } => (id, Some(generation)),
        };
        let mut sessions = self.sessions.lock();
        let Some(cached) = sessions.get_mut(&id) else {
            // Evicted or closed meanwhile: the client learns it at its next fetch.
            return items.into_iter().zip(answered).collect();
        };
        // An incremental fetch read the session's partitions in the session's order: the
        // i-th item is the i-th cached partition, unless another fetch on the session (a
        // client that does not wait for answers) changed the order in between. A full
        // fetch's items may name a partition twice, so they are looked up by key.
        let in_order = incremental == Some(cached.generation) && items.len() == cached.partitions.len();
        let mut out = Vec::new();
        let mut any_records = false;
        for (index, (item, data)) in items.into_iter().zip(answered).enumerate() {
            let has_records = data.records.as_ref().is_some_and(|records| !records.is_empty());
            let now = (data.high_watermark, data.last_stable_offset, data.log_start_offset);
            let partition = match in_order {
                true => cached.partitions.get_index_mut(index).map(|(_, partition)| partition),
                false => cached.partitions.get_mut(&item.key()),
            };
            let news = match partition {
                None => true,
                Some(partition) => {
                    assert!(
                        !in_order
                            || partition.item.partition.partition == item.partition.partition
                                && partition.item.same_topic(&item),
                        "an in-order answer is recorded on the partition it was read from"
                    );
                    let changed = partition.last_sent != Some(now);
                    partition.last_sent = Some(now);
                    partition.had_records |= has_records;
                    any_records |= has_records;
                    changed || has_records || data.error_code != 0 || data.diverging_epoch.epoch >= 0
                }
            };
            if news || incremental.is_none() {
                out.push((item, data));
            }
        }
        if any_records {
            // One stable pass, whatever the number of partitions that returned records.
            cached.partitions.sort_by(|_, a, _, b| a.had_records.cmp(&b.had_records));
            cached.partitions.values_mut().for_each(|partition| partition.had_records = false);
        }
        out
    }

    /// Sessions cached now.
    pub(crate) fn len(&self) -> usize {
        self.sessions.lock().len()
    }
}

/// Opens a session holding `items`; `None` when the cache has no room for it.
fn open(sessions: &mut HashMap<i32, FetchSession>, items: &[FetchItem]) -> Option<i32> {
    if items.len() > FETCH_SESSION_PARTITIONS_MAX {
        return None;
    }
    if sessions.len() >= FETCH_SESSIONS_MAX {
        let idle_enough = Duration::from_millis(FETCH_SESSION_EVICTION_MS);
        let (&victim, oldest) = sessions.iter().min_by_key(|(_, session)| session.last_used)?;
        if oldest.last_used.elapsed() < idle_enough && oldest.partitions.len() >= items.len() {
            return None;
        }
        sessions.remove(&victim);
    }
    assert!(sessions.len() < FETCH_SESSIONS_MAX, "the session cache is bounded");
    let id = loop {
        let candidate = (Uuid::new_v4().as_u128() as u32 & 0x7fff_ffff) as i32;
        if candidate != 0 && !sessions.contains_key(&candidate) {
            break candidate;
        }
    };
    let partitions = items
        .iter()
        .map(|item| (item.key(), CachedPartition { item: item.clone(), last_sent: None, had_records: false }))
        .collect();
    sessions.insert(id, FetchSession { partitions, next_epoch: 1, last_used: Instant::now(), generation: 0 });
    Some(id)
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::fetch_request::{FetchTopic, ForgottenTopic};
    use kafka_protocol::protocol::StrBytes;

    use super::*;

    fn name(topic: &str) -> TopicName {
        TopicName(StrBytes::from_string(topic.to_string()))
    }

    fn fetch(session_id: i32, epoch: i32, partitions: &[(i32, i64)], forget: &[i32]) -> FetchRequest {
        let mut request = FetchRequest::default();
        request.session_id = session_id;
        request.session_epoch = epoch;
        let mut topic = FetchTopic::default();
        topic.topic = name("t");
        topic.partitions = partitions
            .iter()
            .map(|&(index, offset)| {
                let mut partition = FetchPartition::default();
                partition.partition = index;
                partition.fetch_offset = offset;
                partition
            })
            .collect();
        request.topics = vec![topic];
        if !forget.is_empty() {
            let mut forgotten = ForgottenTopic::default();
            forgotten.topic = name("t");
            forgotten.partitions = forget.to_vec();
            request.forgotten_topics_data = vec![forgotten];
        }
        request
    }

    fn data(high_watermark: i64, records: bool) -> PartitionData {
        let mut data = PartitionData::default();
        data.high_watermark = high_watermark;
        data.records = records.then(|| bytes::Bytes::from_static(b"batch"));
        data
    }

    fn answered(out: &[(FetchItem, PartitionData)]) -> Vec<i32> {
        out.iter().map(|(item, _)| item.partition.partition).collect()
    }

    #[test]
    fn an_incremental_fetch_carries_only_changed_partitions_and_answers_only_news() {
        let sessions = FetchSessions::default();
        let (session, items) = sessions.begin(fetch(0, 0, &[(0, 0), (1, 0), (2, 0)], &[])).unwrap();
        let FetchSessionUse::Opened { id } = session else { panic!("no session opened: {session:?}") };
        let out = sessions.finish(session, items, vec![data(5, true), data(0, false), data(0, false)]);
        assert_eq!(answered(&out), [0, 1, 2], "a full fetch answers every partition");

        // Epoch 1 moves partition 0's offset; the session still reads all three, partition 0
        // (which returned records) now last. Only partition 2's high watermark moved.
        let (session, items) = sessions.begin(fetch(id, 1, &[(0, 5)], &[])).unwrap();
        assert!(matches!(session, FetchSessionUse::Incremental { id: same, .. } if same == id));
        assert_eq!(
            items.iter().map(|i| (i.partition.partition, i.partition.fetch_offset)).collect::<Vec<_>>(),
            [(1, 0), (2, 0), (0, 5)]
        );
        let out = sessions.finish(session, items, vec![data(0, false), data(3, false), data(5, false)]);
        assert_eq!(answered(&out), [2]);

        // Forgotten partitions are no longer read; a wrong or replayed epoch is refused.
        let (session, items) = sessions.begin(fetch(id, 2, &[], &[1])).unwrap();
        assert_eq!(items.iter().map(|i| i.partition.partition).collect::<Vec<_>>(), [2, 0]);
        sessions.finish(session, items, vec![data(3, false), data(5, false)]);
        assert_eq!(sessions.begin(fetch(id, 2, &[], &[])).unwrap_err(), ResponseError::InvalidFetchSessionEpoch);
        assert_eq!(sessions.begin(fetch(id + 1, 3, &[], &[])).unwrap_err(), ResponseError::FetchSessionIdNotFound);

        // Epoch -1 closes the session and fetches without one.
        let (session, _) = sessions.begin(fetch(id, -1, &[(0, 5)], &[])).unwrap();
        assert_eq!(session, FetchSessionUse::None);
        assert_eq!(sessions.len(), 0);
    }

    #[test]
    fn partitions_that_returned_records_move_to_the_end_in_their_order() {
        let sessions = FetchSessions::default();
        let all: Vec<(i32, i64)> = (0..6).map(|p| (p, 0)).collect();
        let (session, items) = sessions.begin(fetch(0, 0, &all, &[])).unwrap();
        let FetchSessionUse::Opened { id } = session else { panic!("no session opened: {session:?}") };
        let answers = (0..6).map(|p| data(0, p == 1 || p == 4)).collect();
        sessions.finish(session, items, answers);

        let (session, items) = sessions.begin(fetch(id, 1, &[], &[])).unwrap();
        assert_eq!(items.iter().map(|i| i.partition.partition).collect::<Vec<_>>(), [0, 2, 3, 5, 1, 4]);
        // Records from 0 and 5 (the first and the last but two), a moved high watermark on 3.
        let answers = [0, 2, 3, 5, 1, 4].iter().map(|&p| data(if p == 3 { 7 } else { 0 }, p == 0 || p == 5)).collect();
        let out = sessions.finish(session, items, answers);
        assert_eq!(answered(&out), [0, 3, 5]);

        let (session, items) = sessions.begin(fetch(id, 2, &[], &[])).unwrap();
        assert_eq!(items.iter().map(|i| i.partition.partition).collect::<Vec<_>>(), [2, 3, 1, 4, 0, 5]);
        sessions.finish(session, items, (0..6).map(|_| data(0, false)).collect());
    }

    #[test]
    fn a_fetch_begun_before_the_previous_one_finished_is_recorded_by_partition() {
        let sessions = FetchSessions::default();
        let (session, items) = sessions.begin(fetch(0, 0, &[(0, 0), (1, 0), (2, 0)], &[])).unwrap();
        let FetchSessionUse::Opened { id } = session else { panic!("no session opened: {session:?}") };
        sessions.finish(session, items, vec![data(0, false), data(0, false), data(0, false)]);

        // Epoch 1 and epoch 2 (which forgets partition 1) begin before epoch 1 finishes.
        let (first, first_items) = sessions.begin(fetch(id, 1, &[], &[])).unwrap();
        let (second, second_items) = sessions.begin(fetch(id, 2, &[], &[1])).unwrap();
        let out = sessions.finish(first, first_items, vec![data(0, false), data(0, false), data(4, false)]);
        // Partition 2's news, recorded on partition 2; partition 1, forgotten meanwhile, is
        // answered as read.
        assert_eq!(answered(&out), [1, 2]);
        let out = sessions.finish(second, second_items, vec![data(0, false), data(4, false)]);
        assert!(out.is_empty(), "partition 2's high watermark was already sent: {:?}", answered(&out));
    }

    #[test]
    fn the_cache_is_bounded_and_keeps_busy_larger_sessions() {
        let sessions = FetchSessions::default();
        for _ in 0..FETCH_SESSIONS_MAX {
            assert!(matches!(
                sessions.begin(fetch(0, 0, &[(0, 0), (1, 0)], &[])).unwrap().0,
                FetchSessionUse::Opened { .. }
            ));
        }
        // A smaller session does not displace recently used larger ones: it goes sessionless.
        assert_eq!(sessions.begin(fetch(0, 0, &[(0, 0)], &[])).unwrap().0, FetchSessionUse::None);
        // A larger one takes the least recently used slot.
        assert!(matches!(
            sessions.begin(fetch(0, 0, &[(0, 0), (1, 0), (2, 0)], &[])).unwrap().0,
            FetchSessionUse::Opened { .. }
        ));
        assert_eq!(sessions.len(), FETCH_SESSIONS_MAX);
    }
}
