"""One trace from a delivery to the complete that ends its work (issue 21), with OpenTelemetry.

Every todo may carry a W3C ``traceparent``: the one its creator sent, or, for a webhook or stream delivery,
the delivery's own (a trace is started when the sender gave none). Claims hand it to the worker, so the
worker's own spans join the same trace.

Tracing is off unless the standard OTEL_* variables ask for it (``configure``): an OTLP endpoint, or
OTEL_TRACES_EXPORTER=otlp|console. Off, a transition pays one test of a module global (``traced``).

On, each transition emits one span, parented so a trace reads as the work went:

    deliver (webhook/stream) ─┬─ create
                              ├─ claim (attempt 1) ── heartbeat, fail
                              └─ claim (attempt 2) ── heartbeat, complete      (linked to attempt 1)

A claim's span is its attempt: its span id is derived from (todo id, attempt), so the later heartbeat,
complete, fail or release of that attempt (in any process, with no extra column or write) name it as their
parent, and the claim of the next attempt names it as a link: a retry is a new span linked to the earlier
attempt, not its child. (A release gives its attempt back, so the claim after it opens the same attempt
span id again.) Spans are emitted after the statement, with the statement's start time: a claim does not
know its todo before it runs. A transition that is refused (404, 409) emits nothing: it changed nothing.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags

F = TypeVar("F", bound=Callable[..., Any])

ENABLED = False  # read on every transition: the whole cost of tracing when it is off
_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None

# W3C Trace Context, version 00 (lower-case hex; all-zero ids are invalid, checked by SpanContext.is_valid).
TRACEPARENT_RE = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def parse(traceparent: str | None) -> SpanContext | None:
    """The span context of a W3C traceparent, or None if it is absent or malformed (which W3C Trace
    Context says to ignore)."""
    match = TRACEPARENT_RE.match(traceparent or "")
    if match is None:
        return None
    trace_id, span_id, flags = (int(part, 16) for part in match.groups())
    context = SpanContext(trace_id, span_id, True, TraceFlags(flags))
    return context if context.is_valid else None


def format_traceparent(context: SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def new_traceparent() -> str:
    """A fresh trace (sampled), for a delivery that came with none while tracing is off: it is kept on the
    todos, so a worker's own tracing still ties its spans to the delivery."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def attempt_span_id(todo_id: str, attempt: int) -> int:
    """The span id of attempt ``attempt`` of a todo: derived, so every process names the same span."""
    digest = int.from_bytes(hashlib.blake2b(f"{todo_id}:{attempt}".encode(), digest_size=8).digest(), "big")
    return digest or 1


# The span id the next span started in this context takes (set only around one start_span).
_forced_span_id: ContextVar[int | None] = ContextVar("switchboard_forced_span_id", default=None)


class _IdGenerator(RandomIdGenerator):
    def generate_span_id(self) -> int:
        forced = _forced_span_id.get()
        return forced if forced is not None else super().generate_span_id()


def _exporter_from_environment() -> SpanExporter | None:
    """What the standard variables ask for; None: tracing stays off (the default)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    named = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if named == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if named == "otlp" or (not named and endpoint):
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        if protocol.strip() != "http/protobuf":
            raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: Switchboard ships the http/protobuf exporter.")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()  # endpoint, headers, timeout, compression: from OTEL_EXPORTER_OTLP_*
    return None


def configure(exporter: SpanExporter | None = None) -> bool:
    """Turn tracing on if the environment (or a test, with ``exporter``) asks for it; True if it is on.
    Called once per process by TodosConfig.ready(). The provider also becomes the global one (when none
    is set), so the MCP SDK's own spans join the same traces."""
    global ENABLED, _tracer, _provider
    processor: SpanProcessor
    if exporter is not None:
        processor = SimpleSpanProcessor(exporter)  # a test reads its spans at once
    else:
        found = _exporter_from_environment()
        if found is None:
            return ENABLED
        processor = BatchSpanProcessor(found)  # OTEL_BSP_* tune it
    if _provider is None:
        # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES and OTEL_TRACES_SAMPLER are read here.
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "switchboard"})
        _provider = TracerProvider(resource=resource, id_generator=_IdGenerator())
        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            trace.set_tracer_provider(_provider)
        _tracer = _provider.get_tracer("switchboard")
    _provider.add_span_processor(processor)
    ENABLED = True
    return True


def disable() -> None:
    """Stop emitting (tests); the provider stays for a later configure()."""
    global ENABLED
    ENABLED = False


def _context(parent: SpanContext | None) -> Any:
    return trace.set_span_in_context(NonRecordingSpan(parent)) if parent is not None else None


def _emit(
    name: str,
    start: int,
    *,
    parent: SpanContext | None,
    attributes: dict[str, Any],
    span_id: int | None = None,
    links: Sequence[Link] = (),
) -> None:
    assert _tracer is not None
    token = _forced_span_id.set(span_id) if span_id is not None else None
    try:
        span = _tracer.start_span(name, context=_context(parent), attributes=attributes, links=links, start_time=start)
    finally:
        if token is not None:
            _forced_span_id.reset(token)
    span.end()


def _todo_attributes(todo: Any) -> dict[str, Any]:
    return {"switchboard.todo.id": todo.id, "switchboard.queue": todo.queue, "switchboard.todo.attempt": todo.attempt}


def _attempt_context(todo: Any, attempt: int) -> SpanContext | None:
    root = parse(todo.traceparent)
    if root is None:
        return None
    return SpanContext(root.trace_id, attempt_span_id(todo.id, attempt), True, root.trace_flags)


def _emit_for(verb: str, start: int, todo: Any) -> None:
    root = parse(todo.traceparent)
    name = f"switchboard.{verb}"
    attributes = {**_todo_attributes(todo), "switchboard.todo.state": todo.state}
    if verb == "claim":
        links = []
        if todo.attempt > 1 and (earlier := _attempt_context(todo, todo.attempt - 1)) is not None:
            links.append(Link(earlier, {"switchboard.link": "earlier attempt"}))
        span_id = attempt_span_id(todo.id, todo.attempt) if root is not None else None
        _emit(name, start, parent=root, attributes=attributes, span_id=span_id, links=links)
        return
    # A release or a wait hands its attempt back (attempt - 1 in the row it returns); the others keep it.
    attempt = todo.attempt + 1 if verb in ("release", "wait") else todo.attempt
    holder = verb in ("heartbeat", "complete", "fail", "release", "wait")
    parent = _attempt_context(todo, attempt) if holder and attempt > 0 else root
    _emit(name, start, parent=parent, attributes=attributes)


def traced(verb: str) -> Callable[[F], F]:
    """Emit a span per todo a transition returns (a Todo, a list of them, or a (Todo, created) pair)."""

    def wrap(function: F) -> F:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            if not ENABLED:
                return function(*args, **kwargs)
            start = time.time_ns()
            result = function(*args, **kwargs)
            for todo in _todos_of(result):
                _emit_for(verb, start, todo)
            return result

        return run  # type: ignore[return-value]

    return wrap


def _todos_of(result: Any) -> list[Any]:
    if isinstance(result, list):
        return [t for t in result if hasattr(t, "traceparent")]
    if isinstance(result, tuple):
        return _todos_of(result[0]) if result else []
    return [result] if hasattr(result, "traceparent") else []


@contextlib.contextmanager
def creating_many(items: Sequence[tuple[str | None, str]]) -> Iterator[list[str | None]]:
    """Around a create (one todo or a batch): yields the traceparent to store for each (traceparent, queue),
    in order. On, each item's create span is a child of the one given (or of the caller's current span: a
    delivery); an item with neither starts a trace, and stores it. Never a child of an earlier item's span:
    a batch reads as its items' separate creates."""
    if not ENABLED:
        yield [traceparent for traceparent, _ in items]
        return
    assert _tracer is not None
    spans = []
    try:
        stored: list[str | None] = []
        for traceparent, queue in items:
            parent = parse(traceparent)
            span = _tracer.start_span(
                "switchboard.create", context=_context(parent), attributes={"switchboard.queue": queue}
            )
            spans.append(span)
            stored.append(traceparent if parent is not None else format_traceparent(span.get_span_context()))
        yield stored
    finally:
        for span in spans:
            span.end()


@contextlib.contextmanager
def delivery(source: str, event_type: str, traceparent: str | None) -> Iterator[str]:
    """Around storing a webhook or stream delivery and routing it: yields the traceparent its todos keep.
    On, that is the delivery's span (a child of the sender's traceparent, if it sent one); off, the
    sender's, or a new one."""
    given = parse(traceparent)
    if not ENABLED:
        yield traceparent if given is not None else new_traceparent()  # type: ignore[misc]
        return
    assert _tracer is not None
    with _tracer.start_as_current_span(
        "switchboard.deliver",
        context=_context(given),
        kind=SpanKind.CONSUMER,
        attributes={"switchboard.source": source, "switchboard.event.type": event_type},
    ) as span:
        yield format_traceparent(span.get_span_context())
