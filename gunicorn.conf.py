"""gunicorn settings. Every value can be overridden from the environment (GUNICORN_*), or by flags."""

import os

bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
# Threads, not just processes: a long-poll claim (wait_seconds up to 20) holds its thread while it
# waits, so each worker needs several threads to keep answering other requests meanwhile.
workers = int(os.environ.get("GUNICORN_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("GUNICORN_THREADS", "8"))
# Longer than the longest long-poll (20 s) plus a slow query.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "60"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "25"))
keepalive = 5
accesslog = os.environ.get("GUNICORN_ACCESSLOG") or None
