"""``switchboard``: the API from a shell. Tables for people, ``--json`` for scripts.

Exit codes: 0 ok, 1 error, 2 usage (a bad argument, or one the server refused as invalid), 3 not found,
4 conflict. Configured by SWITCHBOARD_URL and SWITCHBOARD_TOKEN, or --url and --token."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from switchboard_client._api import UNSET
from switchboard_client.client import DEFAULT_URL, Client
from switchboard_client.errors import (
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    ServerUnreachable,
    SwitchboardError,
    Unauthorized,
    Unavailable,
)
from switchboard_client.models import EventSummary, Model, Todo
from switchboard_client.worker import Worker

OK, ERROR, USAGE, NOT_FOUND, CONFLICT = 0, 1, 2, 3, 4


class UsageError(Exception):
    pass


# --- output ---------------------------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    if isinstance(value, Model):
        data = {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "extra"}
        return {**data, **value.extra}
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def _cell(value: Any, width: int = 40) -> str:
    if value is None:
        text = "-"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, dict | list):
        text = json.dumps(value, separators=(",", ":"))
    else:
        text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def table(rows: Sequence[Any], columns: Sequence[tuple[str, Callable[[Any], Any]]]) -> str:
    cells = [[name for name, _ in columns]] + [[_cell(get(row)) for _, get in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


TODO_COLUMNS: list[tuple[str, Callable[[Any], Any]]] = [
    ("ID", lambda t: t.id),
    ("QUEUE", lambda t: t.queue),
    ("KIND", lambda t: t.kind),
    ("STATE", lambda t: "dead-letter" if t.dead_letter else t.state),
    ("ATTEMPT", lambda t: f"{t.attempt}/{t.max_attempts}"),
    ("PRI", lambda t: t.priority),
    ("TITLE", lambda t: t.title),
    ("CREATED", lambda t: t.created_at),
]
QUEUE_COLUMNS: list[tuple[str, Callable[[Any], Any]]] = [
    ("QUEUE", lambda q: q.queue),
    ("PENDING", lambda q: q.pending),
    ("CLAIMED", lambda q: q.claimed),
    ("SCHEDULED", lambda q: q.scheduled),
    ("WAITING", lambda q: q.waiting),
    ("RETRYING", lambda q: q.retry_waiting),
    ("DEAD", lambda q: q.dead_letters),
    ("CANCELLED", lambda q: q.cancelled),
    ("OLDEST", lambda q: None if q.oldest_pending_age_seconds is None else f"{q.oldest_pending_age_seconds:.0f}s"),
    ("PAUSED", lambda q: q.paused),
    ("MAX_CLAIMED", lambda q: q.max_claimed),
    ("RATE", lambda q: q.rate_per_second),
]
CONTROL_COLUMNS: list[tuple[str, Callable[[Any], Any]]] = [
    ("QUEUE", lambda q: q.queue),
    ("PAUSED", lambda q: q.paused),
    ("MAX_CLAIMED", lambda q: q.max_claimed),
    ("RATE", lambda q: q.rate_per_second),
    ("BURST", lambda q: q.rate_burst),
    ("FAIR", lambda q: q.fair),
    ("PER_KEY", lambda q: q.max_claimed_per_key),
]
EVENT_COLUMNS: list[tuple[str, Callable[[Any], Any]]] = [
    ("ID", lambda e: e.id),
    ("SOURCE", lambda e: e.source),
    ("TYPE", lambda e: e.type),
    ("DELIVERY", lambda e: e.delivery_id),
    ("RECEIVED", lambda e: e.received_at),
]


def details(obj: Model) -> str:
    data = jsonable(obj)
    width = max(len(k) for k in data)
    return "\n".join(f"{k.ljust(width)}  {_cell(v, 200)}" for k, v in data.items())


class Output:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def rows(self, rows: Sequence[Any], columns: Sequence[tuple[str, Callable[[Any], Any]]]) -> None:
        print(json.dumps(jsonable(list(rows))) if self.as_json else table(rows, columns))

    def one(self, obj: Model, message: str | None = None) -> None:
        if self.as_json:
            print(json.dumps(jsonable(obj)))
        elif message:
            print(message)
        else:
            print(details(obj))


# --- arguments ------------------------------------------------------------------------------------------


def _json_arg(text: str) -> Any:
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        with open(text[1:]) as f:
            text = f.read()
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc})") from exc


def _weight_arg(text: str) -> tuple[str, float]:
    key, sep, weight = text.rpartition("=")
    try:
        if sep and key:
            return key, float(weight)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError("KEY=WEIGHT, e.g. acme/api=2")


def _limit_arg(text: str) -> float | None:
    if text.lower() in ("none", "off", "null"):
        return None
    try:
        return float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError("a number, or 'none' to remove the limit") from exc


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help=f"server URL (SWITCHBOARD_URL; default {DEFAULT_URL})")
    common.add_argument(
        "--token",
        help="API token; prefer SWITCHBOARD_TOKEN: a flag is visible to every user in the process list and "
        "stays in shell history",
    )
    common.add_argument("--json", action="store_true", help="JSON output for scripts")
    parser = argparse.ArgumentParser(
        prog="switchboard", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, parents=[common]
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(group: Any, name: str, help_: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = group.add_parser(name, help=help_, description=help_, parents=[common])
        return sub

    todos = command(commands, "todos", "list, read, create, cancel and retry todos").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    p = command(todos, "list", "todos in your scopes, newest first")
    p.add_argument("--queue")
    p.add_argument("--state", choices=["scheduled", "pending", "claimed", "waiting", "failed", "done", "cancelled"])
    p.add_argument("--kind")
    p.add_argument("--assignee")
    p.add_argument("--fair-key")
    p.add_argument("--dead", action=argparse.BooleanOptionalAction, default=None, help="dead-letters only (or none)")
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    p = command(todos, "get", "one todo")
    p.add_argument("id")
    p.add_argument("--wait", type=float, dest="wait_seconds", help="await its result up to this many seconds (20)")
    p = command(todos, "create", "create a todo")
    p.add_argument("queue")
    p.add_argument("--kind")
    p.add_argument("--title")
    p.add_argument("--payload", type=_json_arg, help="JSON, @file or - for stdin")
    p.add_argument("--source")
    p.add_argument("--key", dest="idempotency_key", help="idempotency key (also makes a retried create safe)")
    p.add_argument("--assignee")
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--run-at", help="RFC 3339, e.g. 2026-01-02T03:04:05Z")
    p.add_argument("--delay", type=float, dest="delay_seconds", help="seconds from now")
    p.add_argument("--priority", type=int, help="-100..100, lower first")
    p.add_argument("--traceparent", help="W3C trace context: the todo's spans join this trace")
    p.add_argument("--fair-key", help="on a fair queue, the tenant whose share of claims it takes")
    p.add_argument("--depends-on", action="append", help="a todo id that must finish first; repeat for more")
    p.add_argument("--on-dependency-failure", choices=["cancel", "run"])
    p = command(todos, "wait", "hand a claimed todo back to wait for todos, an event or a token")
    p.add_argument("id")
    p.add_argument("--lease", required=True, dest="lease_id", help="the claim's lease_id")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--for-todo", action="append", dest="todos", help="a todo id to await; repeat for more")
    what.add_argument(
        "--for-event", type=_json_arg, dest="event", help='JSON {"source", "type", "match": {"path": value}}'
    )
    what.add_argument("--for-token", action="store_true", dest="token_wait", help="a token whose holder resolves it")
    p.add_argument("--timeout", type=float, required=True, dest="timeout_seconds", help="seconds (up to 30 days)")
    p.add_argument("--on-timeout", choices=["pending", "fail"])
    p.add_argument(
        "--resolver", action="append", dest="resolvers", help="an agent name or scope:<glob> that may resolve it"
    )
    p = command(todos, "resolve", "end a waiting todo's wait now (an operator, or an agent the wait names)")
    p.add_argument("id")
    p.add_argument("--data", type=_json_arg, help="JSON for its next claim, @file or - for stdin")
    p = command(todos, "cancel", "cancel a todo")
    p.add_argument("id")
    p.add_argument("--reason")
    p = command(todos, "retry", "retry a dead-letter")
    p.add_argument("id")
    p.add_argument("--mode", choices=["reset", "once"], default="reset")
    p.add_argument("--note")

    queues = command(commands, "queues", "queue health and controls").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    command(queues, "list", "every queue in your scopes, with counts and controls")
    for name in ("pause", "resume"):
        command(queues, name, f"{name} a queue").add_argument("name")
    p = command(queues, "limits", "show a queue's limits, or set them ('none' removes one)")
    p.add_argument("name")
    p.add_argument("--max-claimed", type=_limit_arg, default=UNSET)
    p.add_argument("--rate", type=_limit_arg, default=UNSET, help="claims a second")
    p.add_argument("--burst", type=_limit_arg, default=UNSET)
    p.add_argument("--fair", action=argparse.BooleanOptionalAction, default=UNSET, help="share claims by fair_key")
    p.add_argument("--weight", action="append", type=_weight_arg, dest="weights", help="KEY=WEIGHT; repeat")
    p.add_argument("--max-claimed-per-key", type=_limit_arg, default=UNSET, help="live leases per fair_key")

    events = command(commands, "events", "webhook events: list, read, replay").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    p = command(events, "list", "events you may see, newest first")
    p.add_argument("--source")
    p.add_argument("--type")
    p.add_argument("--limit", type=int, default=50)
    command(events, "get", "one event, with its payload and todos").add_argument("id")
    command(events, "replay", "run an event's routes again").add_argument("id")

    waitpoints = command(commands, "waitpoints", "resolve a token wait").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    p = command(waitpoints, "resolve", "resolve a token wait by its token (no API token needed)")
    p.add_argument("wait_token", metavar="token")
    p.add_argument("--data", type=_json_arg, help="JSON for its next claim, @file or - for stdin")

    p = command(commands, "claim", "claim todos (prints them with their lease ids)")
    p.add_argument("--queue", action="append", dest="queues", help="name or glob; repeat for more")
    p.add_argument("--limit", type=int)
    p.add_argument("--lease", type=float, dest="lease_seconds")
    p.add_argument("--wait", type=float, dest="wait_seconds", help="long-poll up to this many seconds")
    p.add_argument("--worker")
    for name, help_ in (("complete", "complete a claimed todo"), ("fail", "fail a claimed todo")):
        p = command(commands, name, help_)
        p.add_argument("id")
        p.add_argument("--lease", required=True, dest="lease_id", help="the claim's lease_id")
        if name == "complete":
            p.add_argument("--result", type=_json_arg, help="JSON, @file or - for stdin")
        else:
            p.add_argument("--error", default="")
            p.add_argument("--retry-in", type=float, dest="retry_in_seconds")
    p = command(commands, "release", "hand a claimed todo back")
    p.add_argument("id")
    p.add_argument("--lease", required=True, dest="lease_id")
    p = command(commands, "heartbeat", "extend a claimed todo's lease, with progress or a checkpoint")
    p.add_argument("id")
    p.add_argument("--lease", required=True, dest="lease_id")
    p.add_argument("--lease-seconds", type=float)
    p.add_argument("--percent", type=float, help="progress, 0-100")
    p.add_argument("--message", help="progress message")
    p.add_argument("--checkpoint", type=_json_arg, help="JSON object for the next claimer, @file or -")

    p = command(commands, "worker", "run handlers from a module: a Worker, or a dict of kind -> function")
    p.add_argument("target", help="module[:attribute] (default attribute: worker, else handlers)")
    p.add_argument("--queues", help="comma-separated names or globs (default: all your claim scopes)")
    p.add_argument("--concurrency", type=int)
    p.add_argument("--lease", type=float, dest="lease_seconds")
    p.add_argument("--grace", type=float, dest="grace_seconds", help="seconds to finish after SIGTERM")
    p.add_argument("--poll", type=float, dest="poll_seconds", help="long-poll seconds when idle")
    p.add_argument("--name", help="worker label (owner <agent>/<name>)")
    p.add_argument("--drain", action="store_true", help="exit once the queues are empty")
    p.add_argument("--prefetch", type=int, help="todos claimed ahead of free slots (default: concurrency, at least 10)")
    p.add_argument("--processes", type=int, default=1, help="worker processes, each with its own slots")
    p.add_argument("-v", "--verbose", action="store_true")

    p = command(commands, "watch", "live queue counts (Ctrl-C stops)")
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--queue", help="only queues whose name starts with this")
    p.add_argument("--count", type=int, help="stop after this many refreshes")
    return parser


# --- commands -------------------------------------------------------------------------------------------


def _todos(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.action == "list":
        filters = {k: getattr(args, k) for k in ("queue", "state", "kind", "assignee", "dead", "fair_key")}
        rows: list[Todo] = []
        for todo in client.iter_todos(**filters, page_size=min(max(args.limit, 1), 100)):
            if len(rows) >= args.limit:
                break
            rows.append(todo)
        out.rows(rows, TODO_COLUMNS)
    elif args.action == "get":
        out.one(client.get(args.id, wait_seconds=args.wait_seconds))
    elif args.action == "create":
        fields = ("kind", "title", "payload", "source", "idempotency_key", "assignee", "max_attempts", "run_at")
        extra = ("delay_seconds", "priority", "traceparent", "fair_key", "depends_on", "on_dependency_failure")
        created = client.create(args.queue, **{k: getattr(args, k) for k in (*fields, *extra)})
        verb = "created" if created.created else "exists"
        out.one(created, f"{verb} {created.id} ({created.state}) in {created.queue}")
    elif args.action == "wait":
        waiting = client.wait(
            args.id,
            args.lease_id,
            timeout_seconds=args.timeout_seconds,
            todos=args.todos,
            event=args.event,
            token=args.token_wait,
            on_timeout=args.on_timeout,
            resolvers=args.resolvers,
        )
        message = f"{waiting.id} waiting for {json.dumps(waiting.waiting_for)}"
        if waiting.waitpoint:  # shown this once: print it even without --json
            message += f"\ntoken {waiting.waitpoint.token}\nresolve_url {waiting.waitpoint.resolve_url}"
        out.one(waiting, message)
    elif args.action == "resolve":
        todo = client.resolve(args.id, data=args.data)
        out.one(todo, f"resolved {todo.id} ({todo.state})")
    elif args.action == "cancel":
        todo = client.cancel(args.id, reason=args.reason)
        out.one(todo, f"cancelled {todo.id}")
    else:
        todo = client.retry(args.id, mode=args.mode, note=args.note)
        out.one(todo, f"retrying {todo.id} ({todo.state})")
    return OK


def _queues(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.action == "list":
        out.rows(client.queues(), QUEUE_COLUMNS)
        return OK
    if args.action == "pause":
        controls = client.pause(args.name)
    elif args.action == "resume":
        controls = client.resume(args.name)
    else:
        limits = {
            "max_claimed": args.max_claimed,
            "rate_per_second": args.rate,
            "rate_burst": args.burst,
            "max_claimed_per_key": args.max_claimed_per_key,
        }
        settings: dict[str, Any] = {
            k: (int(v) if isinstance(v, float) and k != "rate_per_second" else v) for k, v in limits.items()
        }
        settings["fair"] = args.fair
        settings["fair_weights"] = dict(args.weights) if args.weights else UNSET
        if all(v is UNSET for v in settings.values()):
            controls = client.queue(args.name)
        else:
            controls = client.set_limits(args.name, **settings)
    out.rows([controls], CONTROL_COLUMNS) if not out.as_json else out.one(controls)
    return OK


def _events(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.action == "list":
        rows: list[EventSummary] = []
        for event in client.iter_events(source=args.source, type=args.type, page_size=min(max(args.limit, 1), 100)):
            if len(rows) >= args.limit:
                break
            rows.append(event)
        out.rows(rows, EVENT_COLUMNS)
    elif args.action == "get":
        out.one(client.event(args.id))
    else:
        replay = client.replay(args.id)
        out.one(
            replay, f"replayed {replay.event_id}: {len(replay.todo_ids)} todo(s), {len(replay.created_todo_ids)} new"
        )
    return OK


def _waitpoints(client: Client, args: argparse.Namespace, out: Output) -> int:
    out.one(client.resolve_waitpoint(args.wait_token, data=args.data), "resolved")
    return OK


def _claim(client: Client, args: argparse.Namespace, out: Output) -> int:
    todos = client.claim(
        args.queues,
        limit=args.limit,
        lease_seconds=args.lease_seconds,
        wait_seconds=args.wait_seconds,
        worker=args.worker,
    )
    columns = [*TODO_COLUMNS[:4], ("LEASE", lambda t: t.lease_id), ("EXPIRES", lambda t: t.lease_expires_at)]
    out.rows(todos, columns)
    return OK


def _finish(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.command == "complete":
        todo = client.complete(args.id, args.lease_id, result=args.result)
    elif args.command == "fail":
        todo = client.fail(args.id, args.lease_id, error=args.error, retry_in_seconds=args.retry_in_seconds)
    elif args.command == "heartbeat":
        progress = {k: v for k, v in (("percent", args.percent), ("message", args.message)) if v is not None}
        todo = client.heartbeat(
            args.id,
            args.lease_id,
            lease_seconds=args.lease_seconds,
            progress=progress or None,
            checkpoint=args.checkpoint,
        )
    else:
        todo = client.release(args.id, args.lease_id)
    out.one(todo, f"{todo.id} {'dead-letter' if todo.dead_letter else todo.state}")
    return OK


def load_worker(target: str, client: Client) -> Worker:
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from exc
    names = [attribute] if attribute else ["worker", "handlers"]
    for name in names:
        found = getattr(module, name, None)
        if isinstance(found, Worker):
            found.client = client
            return found
        if isinstance(found, dict):
            worker = Worker(client)
            for kind, function in found.items():
                worker.add_handler(kind, function)
            return worker
    raise UsageError(f"{target}: expected a Worker or a dict of kind -> handler at {' or '.join(names)}")


def _worker(client: Client, args: argparse.Namespace, out: Output) -> int:
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s"
    )
    if args.processes < 1:
        raise UsageError("--processes must be at least 1")
    if args.processes > 1:
        return _processes(client, args, out)
    sys.path.insert(0, "")  # a module in the current directory, as `python -m` finds it
    worker = load_worker(args.target, client)
    for name in ("concurrency", "lease_seconds", "grace_seconds", "poll_seconds", "name", "prefetch"):
        if getattr(args, name) is not None:
            setattr(worker, name, getattr(args, name))
    if args.queues:
        worker.queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    worker.drain = worker.drain or args.drain
    stats = worker.run()
    if worker.error is not None:
        raise worker.error
    print(
        json.dumps(jsonable(stats)) if out.as_json else f"stopped: {stats}",
        file=sys.stdout if out.as_json else sys.stderr,
    )
    return OK


FORWARDED = (signal.SIGTERM, signal.SIGINT)


def _child_setup(parent: int) -> None:
    """In a --processes child before its exec: take signals again (held while it started), and on Linux
    be sent SIGTERM when the parent dies (if it died already, before this, go now)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)


def _processes(client: Client, args: argparse.Namespace, out: Output) -> int:
    """``--processes N``: N worker processes (this command without --processes), each with its own
    slots, its own claims and connections. SIGTERM/SIGINT here is passed to each (a second one too: it
    skips their grace); exits once all have, 1 if any failed."""
    command = [sys.executable, "-m", "switchboard_client", "worker", args.target]
    command += ["--json"] if out.as_json else []
    for flag, name in (
        ("--queues", "queues"),
        ("--concurrency", "concurrency"),
        ("--lease", "lease_seconds"),
        ("--grace", "grace_seconds"),
        ("--poll", "poll_seconds"),
        ("--prefetch", "prefetch"),
    ):
        if getattr(args, name) is not None:
            command += [flag, str(getattr(args, name))]
    command += ["--drain"] if args.drain else []
    command += ["--verbose"] if args.verbose else []
    # The URL and token go by the environment: a child's arguments are visible to every user (ps).
    env = {**os.environ, "SWITCHBOARD_URL": client.url, "SWITCHBOARD_TOKEN": client.token or ""}
    children: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    # Installed before the first child starts: a signal while they start reaches those already running.
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        # Each child in its own process group: a terminal's Ctrl-C reaches them once, through here, not
        # twice (a second signal would skip their grace). On Linux a child is sent SIGTERM if this
        # process dies (even by SIGKILL), so none runs on unsupervised.
        for i in range(args.processes):
            # Signals held while a child starts and joins the list: one that came meanwhile is handled
            # once the child is in it, so it reaches that child too (the child unblocks them before exec).
            held = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
            try:
                children.append(
                    subprocess.Popen(  # noqa: S603 (this interpreter and our own arguments)
                        command + (["--name", f"{args.name}-{i}"] if args.name else []),
                        env=env,
                        process_group=0,
                        preexec_fn=functools.partial(_child_setup, os.getpid()),
                    )
                )
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
        codes = [child.wait() for child in children]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return OK if all(code == 0 for code in codes) else ERROR


def _watch(client: Client, args: argparse.Namespace, out: Output) -> int:
    shown = 0
    try:
        while args.count is None or shown < args.count:
            rows = [q for q in client.queues() if not args.queue or q.queue.startswith(args.queue)]
            if out.as_json:
                print(json.dumps({"at": datetime.now().astimezone().isoformat(), "queues": jsonable(rows)}), flush=True)
            else:
                clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""
                print(f"{clear}{client.url}  {datetime.now():%H:%M:%S}\n{table(rows, QUEUE_COLUMNS)}\n", flush=True)
            shown += 1
            if args.count is None or shown < args.count:
                time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    return OK


HANDLERS: dict[str, Callable[[Client, argparse.Namespace, Output], int]] = {
    "todos": _todos,
    "queues": _queues,
    "events": _events,
    "claim": _claim,
    "complete": _finish,
    "fail": _finish,
    "release": _finish,
    "heartbeat": _finish,
    "waitpoints": _waitpoints,
    "worker": _worker,
    "watch": _watch,
}


def _explain(exc: SwitchboardError, client: Client) -> tuple[str, int]:
    if isinstance(exc, Unauthorized):
        if not client.token:
            return "no token: set SWITCHBOARD_TOKEN or pass --token", ERROR
        return f"the server at {client.url} refused the token (401): check SWITCHBOARD_TOKEN or --token", ERROR
    if isinstance(exc, ServerUnreachable):
        return f"cannot reach the server at {client.url}: is it running? (SWITCHBOARD_URL or --url)", ERROR
    if isinstance(exc, Unavailable):
        return f"the server is unavailable ({exc.detail}); retry shortly", ERROR
    if isinstance(exc, Invalid):
        return f"invalid: {exc.detail} " + " ".join(f"{k}: {' '.join(v)}" for k, v in exc.fields.items()), USAGE
    if isinstance(exc, NotFound):
        return f"not found: {exc.detail}", NOT_FOUND
    if isinstance(exc, Conflict):
        return f"conflict: {exc.detail}" + (f" (state: {exc.state})" if exc.state else ""), CONFLICT
    if isinstance(exc, Forbidden):
        return f"forbidden: {exc.detail}", ERROR
    return str(exc), ERROR


VISIBLE_FLAG_WARNING = (
    "switchboard: warning: --token is visible to other users (ps) and kept in shell history; "
    "set SWITCHBOARD_TOKEN instead"
)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.token:
        # ps shows every process's arguments to every user of the machine: an agent's token there is taken.
        print(VISIBLE_FLAG_WARNING, file=sys.stderr)
    out = Output(args.json)
    client = Client(args.url, args.token)
    try:
        return HANDLERS[args.command](client, args, out)
    except SwitchboardError as exc:
        (message, code), name = _explain(exc, client), exc.code
    except UsageError as exc:
        message, code, name = str(exc), USAGE, "usage"
    except BrokenPipeError:  # `switchboard todos list | head`
        return OK
    finally:
        client.close()
    if args.json:
        print(json.dumps({"error": {"code": name, "message": message}}), file=sys.stderr)
    else:
        print(f"switchboard: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
