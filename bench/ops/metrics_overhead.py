"""What the instrumentation costs: one transition counter increment, and the two per-request metrics.

.venv/bin/python bench/ops/metrics_overhead.py sp    # single-process (tests, manage.py commands)
.venv/bin/python bench/ops/metrics_overhead.py mp    # multiprocess mode, as under gunicorn
"""

import argparse
import os
import sys
import tempfile
import time

parser = argparse.ArgumentParser(description="What one counter increment and one request's metrics cost.")
parser.add_argument("mode", choices=["sp", "mp"], help="sp: single-process; mp: multiprocess, as under gunicorn")
mp = parser.parse_args().mode == "mp"
if mp:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from switchboard.metrics import HTTP_LATENCY, HTTP_REQUESTS  # noqa: E402 (after the env var: multiprocess mode is chosen at import)
from todos.metrics import TRANSITIONS  # noqa: E402

n = 100_000
t = time.perf_counter()
for _ in range(n):
    TRANSITIONS.labels(verb="complete", outcome="ok").inc()
a = (time.perf_counter() - t) / n * 1e6
t = time.perf_counter()
for _ in range(n):
    HTTP_REQUESTS.labels(method="POST", route="api/v1/todos/<str:todo_id>/complete/", status="200").inc()
    HTTP_LATENCY.labels(method="POST", route="api/v1/todos/<str:todo_id>/complete/").observe(0.004)
b = (time.perf_counter() - t) / n * 1e6
print(f"{'multiprocess' if mp else 'single-process'}: transition counter {a:.2f} us; per-request metrics {b:.2f} us")
