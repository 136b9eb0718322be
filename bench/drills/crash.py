"""Crash drill: 4 reference workers drain 2,000 todos while one of them is killed with SIGKILL every
2 s and restarted. Afterwards every todo is done (none lost, none stuck) and the number processed
twice is at most the number of kills.

    python -m bench.drills.crash [--todos 2000] [--workers 4] [--kill-every 2]
"""

from __future__ import annotations

import argparse
import random
import signal
import time
from collections import Counter

from bench import harness as h
from bench.drills import common as c

QUEUE = "drill-crash"
LEASE_SECONDS = "5"  # short, so a killed worker's todo comes back within seconds


def drill(todos: int, workers: int, kill_every: float, timeout: float) -> None:
    c.require_worker()
    db = c.DrillDb("crash")
    _, token = db.agent()
    record_file = h.out_dir() / "drill-crash-records.txt"
    record_file.write_text("")
    ids = c.seed_todos(QUEUE, todos)
    with db.gunicorn(QUEUE_DEFAULT_LEASE_SECONDS=LEASE_SECONDS) as base:
        c.require_api(base, token)
        argv = c.worker_argv(base, token, QUEUE, "bench.drills.handlers:record")
        log = h.out_dir() / "drill-crash-workers.log"
        log.write_text("")
        env = {"DRILL_RECORD_FILE": str(record_file)}
        procs = [c.start_worker(argv, log, **env) for _ in range(workers)]
        kills, started = 0, time.monotonic()
        next_kill = started + kill_every
        try:
            while c.state_counts(QUEUE).get("done", 0) < todos:
                now = time.monotonic()
                if now - started > timeout:
                    break
                for i, p in enumerate(procs):
                    if p.poll() is not None and p.returncode != -signal.SIGKILL:
                        raise c.Failed(f"a worker exited by itself with {p.returncode}; see {log}")
                    if p.poll() is not None:
                        procs[i] = c.start_worker(argv, log, **env)
                if now >= next_kill:
                    victim = random.randrange(workers)
                    procs[victim].send_signal(signal.SIGKILL)
                    procs[victim].wait()
                    kills += 1
                    procs[victim] = c.start_worker(argv, log, **env)
                    next_kill += kill_every
                time.sleep(0.1)
            took = time.monotonic() - started
        finally:
            for p in procs:
                h.stop(p)
    counts = c.state_counts(QUEUE)
    records = Counter(line.split()[0] for line in record_file.read_text().splitlines() if line.strip())
    twice = sum(n - 1 for n in records.values() if n > 1)
    c.figure(f"{todos} todos, {workers} workers, {kills} SIGKILLs in {took:.0f} s ({todos / took:.0f} todos/s)")
    c.figure(f"states afterwards: {dict(counts)}; processed more than once: {twice} (kills: {kills})")
    c.check(counts.get("done", 0) == todos, f"all {todos} todos are done (none lost, none stuck)")
    c.check(set(records) == ids, "every todo was processed, and nothing else was")
    c.check(twice <= kills, f"todos processed twice ({twice}) <= kills ({kills})")
    c.check(kills > 0, "the drill killed workers while they worked")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--todos", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kill-every", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    c.run_drill("crash", lambda: drill(args.todos, args.workers, args.kill_every, args.timeout))


if __name__ == "__main__":
    main()
