//! The leadership lifecycle every coordinator shares. A coordinator keeps one *shard* per
//! partition of its internal topic that this node leads (a single node leads its one
//! local partition, 0): the partition's state, replayed from its log. Leadership changes
//! arrive with the metadata ([`Shards::follow`]): a newly led partition is *loading* while
//! its log is replayed off the async threads, then *active*; a partition led no longer, or
//! led at another epoch, is dropped at once. A load that finishes after its partition
//! changed hands again is discarded: each load carries a generation, and only the load of
//! the slot's current generation may activate it ([`Shards::activate`]).
//!
//! A key (a group id, a transactional id, a share-state key) is served only by the leader
//! of its partition ([`crate::placement::partition_for`]). Until then the answer is
//! [`NotServed::Loading`] where this node is, or is about to be, the leader (clients retry
//! at the same node), and [`NotServed::NotLeader`] elsewhere.
//!
//! What a shard holds and what dropping it means is each coordinator's; this module owns
//! only which partitions are served here, at which epoch.

use std::collections::HashMap;
use std::sync::Arc;

use crate::placement::{partition_for, IncomingLeaderships};

/// A coordinator's state for one partition of its internal topic.
pub trait CoordinatorShard: Send + Sync {
    /// The leader epoch the partition was loaded at (Kafka's coordinator epoch).
    fn leader_epoch(&self) -> i32;
}

/// Where a led partition stands.
enum Slot<S> {
    Loading { leader_epoch: i32, generation: u64 },
    Active(Arc<S>),
}

/// Why this node does not serve a key or a partition now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotServed {
    /// This node leads (or is about to lead) the partition and is replaying its log.
    Loading,
    /// Another node leads the partition, or none does.
    NotLeader,
    /// The internal topic's partition count is not known here yet (a cluster that has not
    /// created the topic).
    NoPartitions,
}

/// A partition this node now leads (through `replica`, the led replica of a cluster), to
/// replay outside any lock and then [`Shards::activate`].
pub struct Load<R> {
    pub partition: i32,
    pub replica: R,
    pub leader_epoch: i32,
    pub generation: u64,
}

/// An active shard dropped by [`Shards::follow`], with the partition count it was placed
/// under (which keys were its).
pub struct Dropped<S> {
    pub partition: i32,
    pub partition_count: i32,
    pub shard: Arc<S>,
}

/// What [`Shards::follow`] changed.
pub struct Followed<S, R> {
    /// Newly led partitions, to load.
    pub loads: Vec<Load<R>>,
    /// Active shards led no longer (or at another epoch).
    pub dropped: Vec<Dropped<S>>,
}

/// The partitions of a coordinator's internal topic served on this node.
pub struct Shards<S> {
    /// Partitions of the internal topic (0 until a cluster node learns it).
    partition_count: i32,
    slots: HashMap<i32, Slot<S>>,
    next_generation: u64,
    /// Leaderships of the metadata being applied, not yet taken (see [`IncomingLeaderships`]).
    incoming: IncomingLeaderships,
}

impl<S> Default for Shards<S> {
    fn default() -> Shards<S> {
        Shards { partition_count: 0, slots: HashMap::new(), next_generation: 0, incoming: Default::default() }
    }
}

impl<S: CoordinatorShard> Shards<S> {
    /// A single node: its one local partition, active.
    pub fn local(shard: S) -> Shards<S> {
        Shards { partition_count: 1, slots: HashMap::from([(0, Slot::Active(Arc::new(shard)))]), ..Shards::default() }
    }

    /// Partitions of the internal topic (0 until a cluster node learns it; 1 on a single node).
    pub fn partition_count(&self) -> i32 {
        self.partition_count
    }

    /// The partition of `key`, once the partition count is known.
    pub fn partition_of(&self, key: &str) -> Option<i32> {
        (self.partition_count > 0).then(|| partition_for(key, self.partition_count))
    }

    /// The partitions that the metadata being applied has this node lead, before
    /// [`Shards::follow`] takes them.
    pub fn expect(&mut self, incoming: IncomingLeaderships) {
        self.incoming = incoming;
    }

    /// Follows the leadership of the internal topic's partitions (`leaders[p]`: the replica
    /// and leader epoch when this node leads partition p). A new partition count drops
    /// every shard (every key's placement changes).
    pub fn follow<R>(&mut self, leaders: Vec<Option<(R, i32)>>) -> Followed<S, R> {
        let count = i32::try_from(leaders.len()).expect("partition count fits i32");
        self.incoming = IncomingLeaderships::default();
        let mut followed = Followed { loads: Vec::new(), dropped: Vec::new() };
        if self.partition_count != count {
            let partitions: Vec<i32> = self.slots.keys().copied().collect();
            for partition in partitions {
                self.drop_slot(partition, &mut followed.dropped);
            }
            self.partition_count = count;
        }
        for (partition, leader) in (0..count).zip(leaders) {
            let current_epoch = self.slots.get(&partition).map(|slot| match slot {
                Slot::Loading { leader_epoch, .. } => *leader_epoch,
                Slot::Active(shard) => shard.leader_epoch(),
            });
            if current_epoch == leader.as_ref().map(|(_, epoch)| *epoch) {
                continue;
            }
            self.drop_slot(partition, &mut followed.dropped);
            if let Some((replica, leader_epoch)) = leader {
                let generation = self.next_generation;
                self.next_generation += 1;
                self.slots.insert(partition, Slot::Loading { leader_epoch, generation });
                followed.loads.push(Load { partition, replica, leader_epoch, generation });
            }
        }
        followed
    }

    fn drop_slot(&mut self, partition: i32, dropped: &mut Vec<Dropped<S>>) {
        if let Some(Slot::Active(shard)) = self.slots.remove(&partition) {
            dropped.push(Dropped { partition, partition_count: self.partition_count, shard });
        }
    }

    /// Whether `partition` still waits for the load of `generation`: false once it changed
    /// hands again (that load's result is to be discarded).
    pub fn awaits(&self, partition: i32, generation: u64) -> bool {
        matches!(self.slots.get(&partition), Some(Slot::Loading { generation: current, .. }) if *current == generation)
    }

    /// Serves `shard` for `partition`, loaded at `generation`; false (and nothing changes)
    /// when the partition no longer waits for that load.
    pub fn activate(&mut self, partition: i32, generation: u64, shard: S) -> bool {
        if !self.awaits(partition, generation) {
            return false;
        }
        let Some(Slot::Loading { leader_epoch, .. }) = self.slots.get(&partition) else { unreachable!() };
        assert_eq!(*leader_epoch, shard.leader_epoch(), "a shard serves the epoch it was loaded for");
        self.slots.insert(partition, Slot::Active(Arc::new(shard)));
        true
    }

    /// The active shards.
    pub fn active(&self) -> impl Iterator<Item = &Arc<S>> {
        self.slots.values().filter_map(|slot| match slot {
            Slot::Active(shard) => Some(shard),
            Slot::Loading { .. } => None,
        })
    }

    /// The shard serving `key`'s partition here, or why there is none.
    pub fn serving(&self, key: &str) -> Result<&Arc<S>, NotServed> {
        match self.partition_of(key).and_then(|partition| self.slots.get(&partition)) {
            Some(Slot::Active(shard)) => Ok(shard),
            Some(Slot::Loading { .. }) => Err(NotServed::Loading),
            None if self.incoming.holds(key) => Err(NotServed::Loading),
            None if self.partition_count == 0 => Err(NotServed::NoPartitions),
            None => Err(NotServed::NotLeader),
        }
    }

    /// The shard of `partition` here, or why there is none.
    pub fn serving_partition(&self, partition: i32) -> Result<&Arc<S>, NotServed> {
        match self.slots.get(&partition) {
            Some(Slot::Active(shard)) => Ok(shard),
            Some(Slot::Loading { .. }) => Err(NotServed::Loading),
            None if self.incoming.holds_partition(partition) => Err(NotServed::Loading),
            None => Err(NotServed::NotLeader),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Shard(i32);

    impl CoordinatorShard for Shard {
        fn leader_epoch(&self) -> i32 {
            self.0
        }
    }

    /// A key of partition `partition` among `count`.
    fn key_of(partition: i32, count: i32) -> String {
        (0..).map(|i| format!("key-{i}")).find(|key| partition_for(key, count) == partition).unwrap()
    }

    #[test]
    fn a_led_partition_loads_then_serves_and_another_leader_drops_it() {
        let mut shards = Shards::<Shard>::default();
        let key = key_of(1, 3);
        assert_eq!(shards.serving(&key).err(), Some(NotServed::NoPartitions));
        let followed = shards.follow(vec![None, Some(("replica", 5)), None]);
        assert_eq!(followed.loads.len(), 1);
        let load = &followed.loads[0];
        assert_eq!((load.partition, load.leader_epoch, load.replica), (1, 5, "replica"));
        assert_eq!(shards.serving(&key).err(), Some(NotServed::Loading));
        assert_eq!(shards.serving(&key_of(0, 3)).err(), Some(NotServed::NotLeader));
        assert!(shards.activate(1, load.generation, Shard(5)));
        assert_eq!(shards.serving(&key).unwrap().0, 5);
        assert_eq!(shards.active().count(), 1);
        // The same leaderships again change nothing.
        let again = shards.follow(vec![None, Some(("replica", 5)), None]);
        assert!(again.loads.is_empty() && again.dropped.is_empty());
        // Led no longer: dropped at once, with the count it was placed under.
        let lost = shards.follow::<&str>(vec![None, None, None]);
        assert_eq!(lost.dropped.len(), 1);
        assert_eq!((lost.dropped[0].partition, lost.dropped[0].partition_count), (1, 3));
        assert_eq!(shards.serving(&key).err(), Some(NotServed::NotLeader));
    }

    #[test]
    fn a_load_that_finishes_after_its_partition_changed_hands_is_discarded() {
        let mut shards = Shards::<Shard>::default();
        let first = shards.follow(vec![Some(((), 1))]).loads.remove(0);
        // Led again at a newer epoch before the first load finished.
        let second = shards.follow(vec![Some(((), 2))]).loads.remove(0);
        assert!(!shards.awaits(0, first.generation));
        assert!(!shards.activate(0, first.generation, Shard(1)));
        assert!(shards.activate(0, second.generation, Shard(2)));
        assert_eq!(shards.serving_partition(0).unwrap().0, 2);
        // Lost while loading: the load finds nothing to activate.
        let third = shards.follow(vec![Some(((), 3))]).loads.remove(0);
        assert_eq!(shards.follow::<()>(vec![None]).dropped.len(), 0, "a loading partition has no shard to drop");
        assert!(!shards.activate(0, third.generation, Shard(3)));
    }

    #[test]
    fn a_new_partition_count_drops_every_shard_under_the_old_one() {
        let mut shards = Shards::local(Shard(0));
        assert_eq!(shards.partition_count(), 1);
        let followed = shards.follow(vec![Some(((), 0)), None]);
        assert_eq!(followed.dropped.len(), 1);
        assert_eq!(followed.dropped[0].partition_count, 1);
        assert_eq!(followed.loads.len(), 1, "partition 0 loads again under the new count");
        assert_eq!(shards.partition_count(), 2);
    }

    #[test]
    fn an_announced_leadership_answers_loading_before_it_is_taken() {
        let mut shards = Shards::<Shard>::default();
        let key = key_of(2, 4);
        shards.expect(IncomingLeaderships::new(4, [2].into()));
        assert_eq!(shards.serving(&key).err(), Some(NotServed::Loading));
        assert_eq!(shards.serving_partition(2).err(), Some(NotServed::Loading));
        shards.follow::<()>(vec![None; 4]);
        assert_eq!(shards.serving(&key).err(), Some(NotServed::NotLeader));
    }
}
