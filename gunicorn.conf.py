"""gunicorn settings. Every value can be overridden from the environment (GUNICORN_*), or by flags.

gunicorn manages the processes (graceful stops, max-requests, Prometheus multiprocess); each worker is
uvicorn running Django's ASGI application (switchboard.asgi:application), one event loop per process.
A waiting long-poll is a cheap wait in that loop (todos/longpoll.py): it holds no thread and no
database connection, so a process holds thousands of them. Sync work (every sync request, every
statement) runs in each process's pool of WEB_THREADS threads (switchboard/executor.py), and a watchdog
thread replaces a process whose loop or pool stops moving (switchboard/watchdog.py).
"""

import glob
import logging
import os
import shutil
import signal
import sys
import tempfile

bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
wsgi_app = "switchboard.asgi:application"
workers = int(os.environ.get("GUNICORN_WORKERS", "2"))
worker_class = os.environ.get("GUNICORN_WORKER_CLASS", "uvicorn_worker.UvicornWorker")
# Longer than the longest long-poll (20 s) plus a slow query.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "60"))
# On SIGTERM every waiting long-poll is answered at once with {"todos": []} (todos/longpoll.py), so a
# stop takes as long as the slowest request actually running.
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "25"))
keepalive = 5
# Recycle a worker after this many requests (0 = never); the jitter keeps workers from restarting together.
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "0"))
max_requests_jitter = int(os.environ.get("GUNICORN_MAX_REQUESTS_JITTER", "0")) or max_requests // 10
# Switchboard logs one structured line per request itself (switchboard.request); gunicorn's own
# access log is off unless asked for (it masks waitpoint tokens: post_worker_init).
accesslog = os.environ.get("GUNICORN_ACCESSLOG") or None
# gunicorn's runtime control socket (for gunicornc) defaults to one path per user, which two masters on
# one host would fight over, and a container user may have no home for it: off unless a path is given.
if os.environ.get("GUNICORN_CONTROL_SOCKET"):
    control_socket = os.environ["GUNICORN_CONTROL_SOCKET"]
else:
    control_socket_disable = True

# --- Prometheus multiprocess mode (docs/deploy.md, "Metrics") -----------------------------------------
# Each worker writes its counters to files in PROMETHEUS_MULTIPROC_DIR; /metrics sums every file, so
# the numbers are the whole server's whichever worker answers the scrape, and survive worker restarts.
# The variable must be set before any worker imports prometheus_client, i.e. here, in the master.
# One directory per gunicorn master: it is emptied at start, so two masters must not share one.
_created_metrics_dir = False
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="switchboard-metrics-")
    _created_metrics_dir = True


def on_starting(server):
    directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    os.makedirs(directory, exist_ok=True)
    # Files left by a previous run would add its counts to this one's.
    for stale in glob.glob(os.path.join(directory, "*.db")):
        os.remove(stale)


def _exit_cleanly(signum, frame):
    sys.exit(0)


def post_worker_init(worker):
    # uvicorn's worker resets SIGTERM and SIGINT to the default action, and uvicorn, once it has shut
    # down gracefully, raises the signal again: the worker then dies of it and skips its atexit
    # handlers. The embedded PostgreSQL (switchboard/embedded_db.py) is stopped by the atexit handler
    # of the last process using it, so a killed worker left it running after Ctrl-C. Exiting through
    # SystemExit instead runs them. uvicorn installs its own handlers while it serves.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_cleanly)
    # With an access log on (GUNICORN_ACCESSLOG), a waitpoint token in a path (the older resolve form) is
    # masked: a filter on the logger holds whatever handlers the worker gives it.
    from switchboard.logs import RedactTokensFilter

    for name in ("uvicorn.access", "gunicorn.access"):
        logging.getLogger(name).addFilter(RedactTokensFilter())


def child_exit(server, worker):
    # A dead worker's counters stay in the sums (counters must not go backwards); this drops only its
    # live-gauge files, should any gauge in "live" mode be added later.
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if _created_metrics_dir:
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
