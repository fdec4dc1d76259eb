"""Jepsen's queue semantics over a `History` and the final contents of the log.

- every acknowledged record is in the final log, exactly once, at its acknowledged offset;
- no record appears twice (acknowledged or not: an idempotent producer never duplicates);
- no two different records at one offset, across every read and the final log (a consumer
  that read a record later truncated away saw an uncommitted write);
- each producer's records are in partition order (offsets grow with its sequence);
- polls never go backwards (a consumer's offsets per partition strictly increase);
- nothing is read that no producer wrote.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from faults.workload import History


@dataclass
class CheckResult:
    acknowledged: int = 0
    acknowledged_without_offset: int = 0
    indeterminate: int = 0
    lost: list = field(default_factory=list)
    misplaced: list = field(default_factory=list)  # (value, acked (p, offset), found (p, offset))
    duplicated: list = field(default_factory=list)  # (value, [(p, offset), ...])
    conflicts: list = field(default_factory=list)  # ((p, offset), {values})
    reordered: list = field(default_factory=list)
    backwards: list = field(default_factory=list)
    unexpected: list = field(default_factory=list)
    read_records: int = 0
    final_records: int = 0
    longest_unavailability_s: float = 0.0  # no acknowledgement on any partition
    longest_partition_unavailability_s: float = 0.0  # none on one partition

    @property
    def valid(self) -> bool:
        return not (self.lost or self.misplaced or self.duplicated or self.conflicts or self.reordered
                    or self.backwards or self.unexpected)

    def problems(self) -> str:
        parts = []
        for name in ("lost", "misplaced", "duplicated", "conflicts", "reordered", "backwards", "unexpected"):
            items = getattr(self, name)
            if items:
                parts.append(f"{name}: {len(items)} (first: {items[:5]})")
        return "; ".join(parts) or "none"


def longest_gap(times: list[float], start: float | None = None, end: float | None = None) -> float:
    """Longest time without an acknowledgement, between `start` (or the first) and `end`."""
    points = sorted(times)
    if start is not None:
        points = [start] + [t for t in points if t >= start]
    if end is not None:
        points = [t for t in points if t <= end] + [end]
    return max((b - a for a, b in zip(points, points[1:])), default=0.0)


def check(history: History, final: dict[int, list[tuple[int, str]]], window: tuple[float, float] | None = None
          ) -> CheckResult:
    result = CheckResult(acknowledged=len(history.acks), indeterminate=len(history.failed))
    where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    at: dict[tuple[int, int], set[str]] = defaultdict(set)
    for partition, records in final.items():
        result.final_records += len(records)
        for offset, value in records:
            where[value].append((partition, offset))
            at[(partition, offset)].add(value)
    for read in history.reads:
        at[(read.partition, read.offset)].add(read.value)
    result.read_records = len(history.reads)

    for ack in history.acks:
        found = where.get(ack.value)
        if not found:
            result.lost.append(ack.value)
        elif ack.offset is None:
            # librdkafka acknowledges a record whose first answer was lost but that a later
            # answer proves persisted (or a DUPLICATE_SEQUENCE_NUMBER) without an offset.
            result.acknowledged_without_offset += 1
            if not any(partition == ack.partition for partition, _ in found):
                result.misplaced.append((ack.value, (ack.partition, None), found))
        elif (ack.partition, ack.offset) not in found:
            result.misplaced.append((ack.value, (ack.partition, ack.offset), found))
    result.duplicated = sorted((value, places) for value, places in where.items() if len(places) > 1)
    result.conflicts = sorted((place, values) for place, values in at.items() if len(values) > 1)
    result.unexpected = sorted(value for value in where if value not in history.attempted)
    result.backwards = list(history.backwards)
    result.reordered = reordered(final)
    window = window or (None, None)
    result.longest_unavailability_s = longest_gap([ack.time for ack in history.acks], *window)
    for partition in final:
        times = [ack.time for ack in history.acks if ack.partition == partition]
        gap = longest_gap(times, *window)
        result.longest_partition_unavailability_s = max(result.longest_partition_unavailability_s, gap)
    return result


def reordered(final: dict[int, list[tuple[int, str]]]) -> list:
    """Records of one producer in one partition whose offsets do not grow with their sequence."""
    problems = []
    for partition, records in final.items():
        last: dict[str, tuple[int, int]] = {}
        for offset, value in sorted(records):
            producer, _, seq = value.partition("-")
            if not seq.isdigit():
                continue
            previous = last.get(producer)
            if previous is not None and int(seq) <= previous[0]:
                problems.append((partition, offset, value, previous))
            last[producer] = (int(seq), offset)
    return problems
