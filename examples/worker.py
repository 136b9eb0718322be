#!/usr/bin/env python3
"""A reference Switchboard worker: standard library + requests.

    SWITCHBOARD_URL=http://127.0.0.1:8000 SWITCHBOARD_TOKEN=sb_... \\
        python examples/worker.py --queues demo --handler sleep:2

Loop: long-poll claim (one todo), run the handler while a heartbeat thread extends the lease, then
complete with the handler's return value or fail with the exception's text. SIGTERM or SIGINT stops
it within a second, even mid long-poll: the lease in hand is released (the todo is pending again at
once, its attempt given back), a long-poll in flight is aborted (a todo it brings back in that moment
is released too) and the process exits. SIGKILL leaves the lease to lapse; the todo comes back when it
does.

Handlers: ``sleep:N`` (sleep N seconds, return {"slept": N}), ``crash`` (raise), ``echo`` (return the
payload), or ``module:function`` taking the todo (a dict) and returning a JSON value.
"""

from __future__ import annotations

import argparse
import http.client
import importlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import requests

log = logging.getLogger("worker")

Handler = Callable[[dict[str, Any]], Any]


def builtin_handler(spec: str) -> Handler:
    if spec.startswith("sleep:"):
        seconds = float(spec.split(":", 1)[1])

        def sleep(todo: dict[str, Any]) -> Any:
            time.sleep(seconds)
            return {"slept": seconds}

        return sleep
    if spec == "crash":

        def crash(todo: dict[str, Any]) -> Any:
            raise RuntimeError(f"demo crash on {todo['id']}")

        return crash
    if spec == "echo":
        return lambda todo: todo["payload"]
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name or "handle")


class Client:
    def __init__(self, url: str, token: str, timeout: float = 10.0) -> None:
        self.base = url.rstrip("/") + "/api/v1"
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.token = token
        # The long-poll runs on its own connection, kept here so that a stop can cut it (requests
        # offers no way to abort a call from another thread).
        self._poll: http.client.HTTPConnection | None = None
        self._poll_lock = threading.Lock()

    def post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> requests.Response:
        return self.session.post(self.base + path, json=body, timeout=timeout or self.timeout)

    def long_poll(self, path: str, body: dict[str, Any], timeout: float) -> tuple[int, Any]:
        """POST on a connection that ``abort_poll`` can cut; (status, JSON body). Raises OSError or
        http.client.HTTPException when cut or unreachable."""
        url = urllib.parse.urlsplit(self.base + path)
        kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        conn = kind(url.netloc, timeout=timeout)
        with self._poll_lock:
            self._poll = conn
        try:
            headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
            conn.request("POST", url.path, body=json.dumps(body), headers=headers)
            response = conn.getresponse()
            data = response.read()
            return response.status, json.loads(data) if data else None
        finally:
            with self._poll_lock:
                self._poll = None
            conn.close()

    def abort_poll(self, how: int = socket.SHUT_RDWR) -> None:
        """Cut the long-poll in flight, if any. SHUT_WR only tells the server we are going (it then
        claims nothing) while an answer already on its way can still be read; SHUT_RDWR ends it."""
        with self._poll_lock:
            sock = self._poll.sock if self._poll is not None else None
            if sock is not None:
                try:
                    sock.shutdown(how)
                except OSError:  # already closed
                    pass


class Worker:
    def __init__(self, client: Client, handler: Handler, args: argparse.Namespace) -> None:
        self.client = client
        self.handler = handler
        self.args = args
        self.stopping = threading.Event()
        # Set while a claim (a long-poll) is in flight: a stop then waits for its answer, so that a todo
        # claimed in that moment is released at once instead of lapsing and costing an attempt.
        self.polling = threading.Event()
        self.lock = threading.Lock()
        self.in_hand: dict[str, Any] | None = None  # the todo we hold a lease on
        self.refused = False  # the server refused our claims: the process exits non-zero

    # --- the loop (a background thread) -------------------------------------------------------------
    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                todo = self.claim()
                if todo is not None:
                    self.work(todo)
                elif self.args.drain:
                    return
            except requests.RequestException as exc:
                log.warning("server unreachable (%s); retrying in 1 s", exc.__class__.__name__)
                self.stopping.wait(1.0)

    def claim(self) -> dict[str, Any] | None:
        body = {
            "queues": self.args.queues,
            "lease_seconds": self.args.lease,
            "wait_seconds": self.args.wait,
            "worker": self.args.name,
            "limit": 1,
        }
        self.polling.set()
        try:
            if self.stopping.is_set():
                return None
            status, answer = self.client.long_poll("/todos/claim/", body, timeout=self.args.wait + 10)
        except (OSError, http.client.HTTPException) as exc:
            if self.stopping.is_set():  # cut by the stop: nothing came back
                return None
            raise requests.ConnectionError(str(exc)) from exc
        finally:
            self.polling.clear()
        if status >= 500:
            log.warning("claim answered %s; retrying in 1 s", status)
            self.stopping.wait(1.0)
            return None
        if status != 200:  # a bad token, queues outside the scopes, bad flags: retrying cannot help
            log.error("claim refused (%s): %s", status, (answer or {}).get("error"))
            self.refused = True
            self.stopping.set()
            return None
        todos = answer["todos"]
        if not todos:
            return None
        todo = todos[0]
        with self.lock:
            if self.stopping.is_set():  # stopped while the claim was in flight: hand it straight back
                self.release(todo)
                return None
            self.in_hand = todo
        return todo

    def work(self, todo: dict[str, Any]) -> None:
        log.info("claimed %s (attempt %s)", todo["id"], todo["attempt"])
        beating = threading.Event()
        heart = threading.Thread(target=self.heartbeat, args=(todo, beating), daemon=True)
        heart.start()
        try:
            result, error = self.handler(todo), None
        except Exception as exc:  # the handler's failure becomes the todo's error
            result, error = None, f"{exc.__class__.__name__}: {exc}"
        finally:
            beating.set()
        with self.lock:
            if self.in_hand is not todo:  # released by the stop in the meantime
                return
            self.in_hand = None
            lease = {"lease_id": todo["lease_id"]}
            if error is None:
                response = self.client.post(f"/todos/{todo['id']}/complete/", {**lease, "result": result})
            else:
                response = self.client.post(f"/todos/{todo['id']}/fail/", {**lease, "error": error[:10_000]})
        verb = "completed" if error is None else "failed"
        if response.status_code == 200:
            log.info("%s %s", verb, todo["id"])
        else:
            log.warning("could not mark %s %s: %s %s", todo["id"], verb, response.status_code, response.text[:200])

    def heartbeat(self, todo: dict[str, Any], done: threading.Event) -> None:
        # Extend the lease at a third of its length, so two beats can be lost before it lapses.
        while not done.wait(self.args.lease / 3):
            try:
                response = self.client.post(
                    f"/todos/{todo['id']}/heartbeat/",
                    {"lease_id": todo["lease_id"], "lease_seconds": self.args.lease},
                )
            except requests.RequestException as exc:
                log.warning("heartbeat failed (%s)", exc.__class__.__name__)
                continue
            if response.status_code == 409:
                log.warning("lost the lease on %s; another worker has it", todo["id"])
                return

    # --- stopping (the main thread) -------------------------------------------------------------------
    def stop(self) -> None:
        self.stopping.set()
        with self.lock:
            todo, self.in_hand = self.in_hand, None
            if todo is not None:
                self.release(todo)

    def release(self, todo: dict[str, Any]) -> None:
        try:
            response = self.client.post(f"/todos/{todo['id']}/release/", {"lease_id": todo["lease_id"]})
            log.info("released %s (%s)", todo["id"], response.status_code)
        except requests.RequestException as exc:
            log.warning("could not release %s (%s); its lease will lapse", todo["id"], exc.__class__.__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=env("SWITCHBOARD_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=env("SWITCHBOARD_TOKEN"), help="or SWITCHBOARD_TOKEN")
    parser.add_argument(
        "--queues",
        default=env("SWITCHBOARD_QUEUES", ""),
        help="comma-separated names or globs (default: all the agent's claim scopes)",
    )
    parser.add_argument("--handler", default=env("SWITCHBOARD_HANDLER", "sleep:1"))
    parser.add_argument("--lease", type=float, default=float(env("SWITCHBOARD_LEASE", "30")), help="seconds")
    parser.add_argument("--wait", type=float, default=20.0, help="long-poll seconds (0-20)")
    parser.add_argument("--name", default=env("SWITCHBOARD_WORKER", f"pid{os.getpid()}"), help="worker label")
    parser.add_argument("--drain", action="store_true", help="exit once a claim comes back empty")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("a token is needed: --token or SWITCHBOARD_TOKEN")
    args.queues = [q.strip() for q in args.queues.split(",") if q.strip()] or None
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    worker = Worker(Client(args.url, args.token), builtin_handler(args.handler), args)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # The loop runs in a daemon thread so that the main thread can always answer a signal at once,
    # even while a long-poll or a handler is in progress.
    loop = threading.Thread(target=worker.run, name="loop", daemon=True)
    loop.start()
    while not stop.wait(0.5) and loop.is_alive():
        pass
    log.info("stopping")
    worker.stop()
    if worker.polling.is_set():
        # Tell the server we are going, give a todo it claimed in that moment half a second to arrive
        # (claim() releases it), then cut the connection: the whole stop stays under a second.
        worker.client.abort_poll(socket.SHUT_WR)
        loop.join(timeout=0.5)
        worker.client.abort_poll()
        loop.join(timeout=0.3)
    return 1 if worker.refused else 0


if __name__ == "__main__":
    sys.exit(main())
