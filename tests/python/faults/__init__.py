"""Fault injection for a Sluice cluster: N `sluice serve` processes on loopback behind a
fault-injecting TCP proxy (`proxy`), a nemesis that kills (-9), pauses (SIGSTOP) and
isolates nodes (`runner`), a queue workload of idempotent acks=all producers and consumers
(`workload`), and a checker with Jepsen's queue semantics (`checker`).

Run from the repository root (bounded in time; stops by itself):

    PYTHONPATH=tests/python .venv/bin/python -m faults --nodes 3 --duration 120 \
        --faults kill,pause,partition,controller --level 1

`tests/python/test_faults.py` runs short versions of each fault in the test suite.
"""
