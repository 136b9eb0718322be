"""Run the failure drills (all, or those named) one after another and print a summary.

    python -m bench.drills                      # every drill
    python -m bench.drills poison slow_worker   # some
    python -m bench.drills --allow-skip         # drills waiting for missing pieces don't fail the run

Exit status: 0 if every drill passed, 1 if any failed, 2 if none failed but some were skipped.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench import harness as h
from bench.drills.common import EXIT_FAIL, EXIT_PASS, EXIT_SKIP

DRILLS = ("poison", "slow_worker", "duplicate_storm", "crash", "db_restart")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drills", nargs="*", choices=[[], *DRILLS], help="default: all")
    parser.add_argument("--allow-skip", action="store_true")
    args = parser.parse_args()
    verdicts: dict[str, tuple[str, float]] = {}
    for name in args.drills or DRILLS:
        started = time.monotonic()
        code = subprocess.run([h.PYTHON, "-m", f"bench.drills.{name}"], cwd=h.ROOT, check=False).returncode
        verdict = {EXIT_PASS: "PASS", EXIT_SKIP: "SKIP"}.get(code, "FAIL")
        verdicts[name] = (verdict, time.monotonic() - started)
        print(flush=True)
    print("drill summary")
    for name, (verdict, took) in verdicts.items():
        print(f"  {verdict:4}  {name:16} {took:5.0f} s")
    results = {v for v, _ in verdicts.values()}
    if "FAIL" in results:
        return EXIT_FAIL
    if "SKIP" in results and not args.allow_skip:
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
