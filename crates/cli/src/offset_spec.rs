//! A position in a partition as an operator names it, the same for every command that takes
//! one (`consume --offset`, `topic trim --offset`): `start`, `end`, an offset, `-N` (N before
//! the end, as kcat's `-o -N`), `+N` (N after the start, as rpk's), or `@TIME` (the first record at or
//! after a time: milliseconds since the epoch or RFC 3339), resolved against the partitions'
//! leaders (ListOffsets) and kept within each log's start and end.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::UNIX_EPOCH;

use anyhow::{bail, Context};

use crate::cluster_queries::{offsets_of_topics, EARLIEST_TIMESTAMP, LATEST_TIMESTAMP};
use crate::kafka_connection::Cluster;

/// What ListOffsets answers for a time after the last record.
const NO_OFFSET: i64 = -1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The log start.
    Start,
    /// The log end (the high watermark): the next record written.
    End,
    /// This offset.
    At(i64),
    /// This many records before the end.
    BeforeEnd(i64),
    /// This many records after the start (rpk's `+N`).
    AfterStart(i64),
    /// The first record at or after this time (milliseconds since the epoch).
    Time(i64),
}

impl FromStr for OffsetSpec {
    type Err = anyhow::Error;

    fn from_str(given: &str) -> anyhow::Result<OffsetSpec> {
        let spec = match given {
            "start" | "beginning" | "earliest" | "oldest" => OffsetSpec::Start,
            "end" | "latest" | "newest" => OffsetSpec::End,
            time if time.starts_with('@') => OffsetSpec::Time(parse_time(&time[1..])?),
            before if before.starts_with('-') => match before[1..].parse::<i64>() {
                Ok(n) if n >= 0 => OffsetSpec::BeforeEnd(n),
                _ => bail!("offset {given:?}: -N is N records before the end"),
            },
            after if after.starts_with('+') => match after[1..].parse::<i64>() {
                Ok(n) if n >= 0 => OffsetSpec::AfterStart(n),
                _ => bail!("offset {given:?}: +N is N records after the start"),
            },
            offset => match offset.parse::<i64>() {
                Ok(offset) => OffsetSpec::At(offset),
                Err(_) => bail!("offset {given:?}: must be start, end, an offset, -N, +N or @TIME"),
            },
        };
        Ok(spec)
    }
}

/// Milliseconds since the epoch, or an RFC 3339 time (`2026-12-06T17:00:00Z`).
pub fn parse_time(given: &str) -> anyhow::Result<i64> {
    if let Ok(millis) = given.parse::<i64>() {
        // Negative times are ListOffsets' own codes (-1 latest, -2 earliest, ...).
        if millis < 0 {
            bail!("time {given:?}: before 1970");
        }
        return Ok(millis);
    }
    let time = humantime::parse_rfc3339_weak(given)
        .with_context(|| format!("time {given:?}: milliseconds since the epoch or RFC 3339 (2026-12-06T17:00:00Z)"))?;
    let since = time.duration_since(UNIX_EPOCH).context("a time before 1970")?;
    Ok(i64::try_from(since.as_millis())?)
}

impl OffsetSpec {
    /// The offset of each partition of `topic` named (all of them if `partitions` is None).
    pub fn resolve(
        self,
        cluster: &mut Cluster,
        topic: &str,
        partitions: Option<&[i32]>,
    ) -> anyhow::Result<BTreeMap<i32, i64>> {
        let of_topic = |found: BTreeMap<(String, i32), i64>| -> BTreeMap<i32, i64> {
            found
                .into_iter()
                .filter(|((_, partition), _)| partitions.is_none_or(|wanted| wanted.contains(partition)))
                .map(|((_, partition), offset)| (partition, offset))
                .collect()
        };
        let starts = of_topic(offsets_of_topics(cluster, &[topic], EARLIEST_TIMESTAMP)?);
        let ends = of_topic(offsets_of_topics(cluster, &[topic], LATEST_TIMESTAMP)?);
        if let Some(wanted) = partitions {
            if let Some(missing) = wanted.iter().find(|p| !ends.contains_key(p)) {
                bail!("topic {topic} has no partition {missing}");
            }
        }
        let at_time = match self {
            OffsetSpec::Time(time) => of_topic(offsets_of_topics(cluster, &[topic], time)?),
            _ => BTreeMap::new(),
        };
        let mut resolved = BTreeMap::new();
        for (&partition, &end) in &ends {
            let start = starts.get(&partition).copied().unwrap_or(0);
            let offset = match self {
                OffsetSpec::Start => start,
                OffsetSpec::End => end,
                OffsetSpec::At(offset) => offset,
                OffsetSpec::BeforeEnd(n) => end.saturating_sub(n),
                OffsetSpec::AfterStart(n) => start.saturating_add(n),
                OffsetSpec::Time(_) => match at_time.get(&partition).copied() {
                    Some(NO_OFFSET) | None => end,
                    Some(offset) => offset,
                },
            };
            resolved.insert(partition, offset.clamp(start, end.max(start)));
        }
        Ok(resolved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_read_as_kcat_and_rpk_spell_them() {
        assert_eq!("start".parse::<OffsetSpec>().unwrap(), OffsetSpec::Start);
        assert_eq!("end".parse::<OffsetSpec>().unwrap(), OffsetSpec::End);
        assert_eq!("42".parse::<OffsetSpec>().unwrap(), OffsetSpec::At(42));
        assert_eq!("-3".parse::<OffsetSpec>().unwrap(), OffsetSpec::BeforeEnd(3));
        assert_eq!("+2".parse::<OffsetSpec>().unwrap(), OffsetSpec::AfterStart(2));
        assert_eq!("@1000".parse::<OffsetSpec>().unwrap(), OffsetSpec::Time(1000));
        assert_eq!("@2026-12-03T15:47:11.499Z".parse::<OffsetSpec>().unwrap(), OffsetSpec::Time(1_796_312_831_499));
        assert!("soon".parse::<OffsetSpec>().is_err());
        assert!("@yesterday".parse::<OffsetSpec>().is_err());
        assert!("@-2".parse::<OffsetSpec>().is_err());
    }
}
