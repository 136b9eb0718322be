"""Routing: glob matching, title rendering, and running routes twice (replay)."""

from __future__ import annotations

import pytest
from django.db.models.functions import Now

from events.models import Event
from ingest import routing
from ingest.errors import RoutingFailed
from ingest.routing import TITLE_MAX_LENGTH, render_title
from todos.models import Todo, TodoState

PAYLOAD = {
    "repository": {"full_name": "octo/hello", "private": False},
    "pull_request": {"number": 42, "title": "Fix it", "labels": [{"name": "bug"}, {"name": "p1"}], "draft": None},
    "ratio": 0.5,
    "__class__": "not special",
}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{repository.full_name}#{pull_request.number}", "octo/hello#42"),
        ("PR: {pull_request.title}", "PR: Fix it"),
        ("{missing.path}!", "!"),  # a missing path renders empty
        ("{repository.full_name.deeper}", ""),  # a path through a string is missing
        ("{pull_request.labels.1.name}", "p1"),  # list indexes
        ("{pull_request.labels.9.name}", ""),
        ("{pull_request.draft}|{repository.private}|{ratio}", "|false|0.5"),
        ("{pull_request.labels.0}", '{"name":"bug"}'),  # containers render as compact JSON
        ("{{literal}} {{{repository.full_name}}}", "{literal} {octo/hello}"),
        ("no placeholders", "no placeholders"),
        ("", ""),
        # Format-spec, conversion and attribute tricks are not placeholders: they stay as text.
        ("{pull_request.number:>10}", "{pull_request.number:>10}"),
        ("{pull_request.title!r}", "{pull_request.title!r}"),
        ("{0.__class__.__mro__}", ""),  # item lookups only: no "0" key, so empty
        ("{__class__}", "not special"),  # a key like any other, never an attribute
        ("{repository[full_name]}", "{repository[full_name]}"),
        ("{unclosed", "{unclosed"),
        ("stray } brace", "stray } brace"),
    ],
)
def test_render_title_fills_dotted_paths_and_nothing_else(template, expected):
    assert render_title(template, PAYLOAD) == expected


def test_render_title_turns_control_characters_into_spaces():
    assert render_title("{t}", {"t": "line one\nline two\r\n\tend\x00"}) == "line one line two end"


def test_render_title_is_capped():
    assert len(render_title("{a}{a}{a}", {"a": "x" * 10_000})) == TITLE_MAX_LENGTH
    assert render_title("{a}", {"a": "abcdef"}, max_length=3) == "abc"


def test_render_title_of_a_non_object_payload_is_empty_placeholders():
    assert render_title("[{a}]", ["a"]) == "[]"


def _event(**kw) -> Event:
    defaults = {"source": "gh", "type": "pull_request.opened", "delivery_id": "d1", "payload": PAYLOAD}
    return Event.objects.create(**{**defaults, **kw})


@pytest.mark.parametrize(
    ("pattern", "matches"),
    [
        ("pull_request.*", True),
        ("pull_request.opened", True),
        ("*", True),
        ("pull_request.?pened", True),
        ("pull_request", False),
        ("Pull_Request.*", False),  # case-sensitive
        ("issues.*", False),
    ],
)
def test_route_event_matches_globs_on_the_type(make_source, make_route, pattern, matches):
    make_route(make_source(), pattern, "q")
    routed = routing.route_event(_event(), routing.active_routes("gh"))
    assert len(routed) == (1 if matches else 0)


def test_route_event_with_a_failing_route_raises_routing_failed(make_source, make_route):
    make_route(make_source(), "*", "bad queue name")
    with pytest.raises(RoutingFailed) as exc:
        routing.route_event(_event(), routing.active_routes("gh"))
    assert exc.value.code == "unavailable"


def test_replay_returns_runnable_todos_instead_of_duplicating_them(make_source, make_route):
    make_route(make_source(), "*", "q")
    event = _event()
    [first] = routing.route_event(event, routing.active_routes("gh"))
    [again] = routing.replay(event, agent=None)
    assert again.created is False and again.todo.id == first.todo.id
    assert Todo.objects.count() == 1


@pytest.mark.parametrize(
    "finished",
    [{"state": TodoState.DONE, "completed_at": Now()}, {"state": TodoState.FAILED, "next_retry_at": None}],
)
def test_replay_makes_a_fresh_todo_for_a_done_or_dead_one(make_source, make_route, finished):
    make_route(make_source(), "*", "q")
    event = _event()
    [first] = routing.route_event(event, routing.active_routes("gh"))
    Todo.objects.filter(pk=first.todo.id).update(**finished)
    [again] = routing.replay(event, agent=None)
    assert again.created is True and again.todo.id != first.todo.id
    assert again.todo.idempotency_key == first.todo.idempotency_key
    assert again.todo.state == TodoState.PENDING
    assert Todo.objects.filter(event=event).count() == 2


def test_replay_by_an_agent_runs_only_routes_into_its_create_scopes(make_source, make_route, make_agent):
    source = make_source()
    make_route(source, "*", "github.prs")
    make_route(source, "*", "billing.x")
    agent = make_agent("bot", claim=["github.*"], create=["github.*"])
    routed = routing.replay(_event(), agent=agent)
    assert [r.todo.queue for r in routed] == ["github.prs"]
    assert Todo.objects.count() == 1


def test_replay_with_a_failing_route_creates_none_of_the_todos(make_source, make_route):
    source = make_source()
    make_route(source, "*", "good")
    event = _event()
    make_route(source, "*", "bad queue name")  # saved around validation
    with pytest.raises(RoutingFailed):
        routing.replay(event)
    assert Todo.objects.count() == 0


def test_a_route_with_a_delay_and_a_priority_makes_a_scheduled_todo_with_them(make_source, make_route):
    make_route(make_source(), "*", "q", delay_seconds=120, priority=-4)
    [routed] = routing.route_event(_event(), routing.active_routes("gh"))
    todo = routed.todo
    assert todo.state == "scheduled" and todo.priority == -4
    assert (todo.run_at - todo.created_at).total_seconds() == 120


def test_a_route_without_a_delay_makes_a_pending_todo(make_source, make_route):
    make_route(make_source(), "*", "q")
    [routed] = routing.route_event(_event(), routing.active_routes("gh"))
    assert routed.todo.state == "pending" and routed.todo.priority == 0


def test_a_replay_returns_the_scheduled_todo_instead_of_duplicating_it(make_source, make_route):
    make_route(make_source(), "*", "q", delay_seconds=600)
    event = _event()
    [first] = routing.route_event(event, routing.active_routes("gh"))
    [again] = routing.replay(event)
    assert not again.created and again.todo.id == first.todo.id
