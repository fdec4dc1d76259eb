"""CLI: one bounded fault-injection run; prints the summary table; exit status 1 if the
history is not valid or the cluster did not recover."""

import argparse
import sys
import tempfile
from pathlib import Path

from faults.runner import ALL_FAULTS, FAULTS, RunConfig, run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m faults", description=__doc__)
    parser.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of fault injection")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"comma-separated, of {','.join(ALL_FAULTS)} (power faults need sluice-lossyfs)")
    parser.add_argument("--level", type=int, default=1, choices=(1, 2, 3, 4), help="sluice.durability.level")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=200.0, help="records per second per producer")
    parser.add_argument("--hold", type=float, default=4.0, help="seconds each fault lasts")
    parser.add_argument("--faults-max", type=int, help="stop after this many faults (default: at --duration)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, help="data dirs and node logs (default: a temporary dir)")
    args = parser.parse_args()
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    unknown = [f for f in faults if f not in ALL_FAULTS]
    if unknown or not faults:
        parser.error(f"unknown faults {unknown}; choose from {ALL_FAULTS}")
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="sluice-faults-"))
    print(f"[faults] work dir {work_dir}")
    config = RunConfig(work_dir=work_dir, nodes=args.nodes, duration_s=args.duration, faults=faults,
                       level=args.level, partitions=args.partitions, producers=args.producers,
                       rate_per_s=args.rate, hold_s=args.hold, seed=args.seed,
                       faults_max=args.faults_max)
    report = run(config)
    print(report.table())
    return 0 if report.result.valid and not report.unrecovered else 1


if __name__ == "__main__":
    sys.exit(main())
