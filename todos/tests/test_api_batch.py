"""Dependencies and batch create over HTTP (issue 20): POST /api/v1/todos/ with depends_on, and
POST /api/v1/todos/batch/, all or nothing, with one outcome per item."""

from __future__ import annotations

import re

import pytest

from todos import queue
from todos.models import Dependency, Todo, TodoState

pytestmark = pytest.mark.django_db


def _nothing_written() -> bool:
    return not Todo.objects.exists() and not Dependency.objects.exists()


def test_a_batch_creates_every_item_and_answers_one_outcome_each_in_order(api):
    body = {
        "todos": [
            {"queue": "checks", "kind": "lint", "idempotency_key": "lint"},
            {"queue": "checks", "kind": "test", "priority": -5},
            {"queue": "merge", "kind": "merge", "depends_on_index": [0, 1]},
        ]
    }
    response = api.post("/todos/batch/", body)
    assert response.status_code == 200, response.json()
    outcomes = response.json()["outcomes"]
    assert [(o["status"], o["state"]) for o in outcomes] == [(201, "pending"), (201, "pending"), (201, "waiting")]
    made = [Todo.objects.get(pk=o["id"]) for o in outcomes]
    assert [t.kind for t in made] == ["lint", "test", "merge"] and made[1].priority == -5
    merge = api.get(f"/todos/{outcomes[2]['id']}/").json()
    assert [d["id"] for d in merge["dependencies"]] == [outcomes[0]["id"], outcomes[1]["id"]]
    again = api.post("/todos/batch/", {"todos": body["todos"][:1]}).json()["outcomes"]
    assert again == [{"status": 200, "id": outcomes[0]["id"], "state": "pending"}]


def test_a_batch_with_one_bad_item_writes_nothing_and_names_the_item_and_field(api):
    todos = [{"queue": "q", "title": f"t{i}"} for i in range(5)]
    todos[3]["priority"] = 1000
    response = api.post("/todos/batch/", {"todos": todos})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid" and set(error["fields"]) == {"todos.3.priority"}
    assert error["detail"].startswith("Item 3 is invalid (priority)")
    assert _nothing_written()


def test_a_batch_naming_a_dependency_it_cannot_see_is_404_naming_it_and_writes_nothing(make_agent, api_for):
    hidden, _ = queue.create(queue="secret")
    api = api_for(make_agent("narrow", claim=["open.*"], create=["open.*"]))
    response = api.post(
        "/todos/batch/", {"todos": [{"queue": "open.a"}, {"queue": "open.b", "depends_on": [hidden.id]}]}
    )
    assert response.status_code == 404
    assert response.json()["error"]["fields"] == {"todos.1.depends_on": [f"No todo {hidden.id}."]}
    assert list(Todo.objects.values_list("id", flat=True)) == [hidden.id] and not Dependency.objects.exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"todos": []}, "todos"),
        ({"todos": [{"queue": "q"}] * 1001}, "todos"),
        ({"todos": [{"queue": "q"}], "extra": 1}, "extra"),
        ({"todos": [{"queue": "q", "titel": "typo"}]}, "todos.0.titel"),
        ({"todos": [{"queue": "q"}, {"queue": "q", "depends_on_index": [1]}]}, "todos.1.depends_on_index"),
        ({"todos": [{"queue": "q", "depends_on_index": [0]}]}, "todos.0.depends_on_index"),
    ],
)
def test_a_bad_batch_is_400_naming_the_field_and_writes_nothing(api, body, field):
    response = api.post("/todos/batch/", body)
    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"]
    assert _nothing_written()


def test_create_with_dependencies_waits_and_lists_them_with_state_and_result(api, agent):
    a, _ = queue.create(queue="kids")
    b, _ = queue.create(queue="kids")
    response = api.post("/todos/", {"queue": "parents", "depends_on": [a.id, b.id], "on_dependency_failure": "run"})
    assert response.status_code == 201
    body = response.json()
    assert body["state"] == "waiting" and body["on_dependency_failure"] == "run"
    assert body["dependencies"] == [
        {"id": a.id, "state": "pending", "dead_letter": False, "result": None},
        {"id": b.id, "state": "pending", "dead_letter": False, "result": None},
    ]
    for child in (a, b):
        held = queue.claim(child.id, agent=agent)
        queue.complete(child.id, agent=agent, lease_id=held.lease_id or "", result={"child": child.id})
    [claimed] = api.post("/todos/claim/", {"queues": ["parents"]}).json()["todos"]
    assert claimed["id"] == body["id"]
    assert [d["result"] for d in claimed["dependencies"]] == [{"child": a.id}, {"child": b.id}]


def test_results_past_the_budget_are_left_out_and_marked(api, agent, settings):
    big = "x" * 40_000
    children = [queue.create(queue="kids")[0] for _ in range(3)]
    parent = api.post("/todos/", {"queue": "parents", "depends_on": [c.id for c in children]}).json()
    for child in children:
        held = queue.claim(child.id, agent=agent)
        queue.complete(child.id, agent=agent, lease_id=held.lease_id or "", result={"blob": big})
    listed = api.get(f"/todos/{parent['id']}/").json()["dependencies"]
    assert [d["result"] is not None for d in listed] == [True, False, False]
    assert [d.get("result_truncated", False) for d in listed] == [False, True, True]


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"queue": "q", "depends_on": ["td_" + "0" * 32] * 101}, 400, "depends_on"),
        ({"queue": "q", "depends_on": "td_x"}, 400, "depends_on"),
        ({"queue": "q", "on_dependency_failure": "ignore"}, 400, "on_dependency_failure"),
        ({"queue": "q", "depends_on_index": [0]}, 400, "depends_on_index"),
        ({"queue": "q", "depends_on": ["td_" + "0" * 32]}, 404, "depends_on"),
    ],
)
def test_bad_dependencies_on_create_name_the_field_and_write_nothing(api, body, status, field):
    response = api.post("/todos/", body)
    assert response.status_code == status, response.json()
    assert field in response.json()["error"]["fields"]
    assert _nothing_written()


def test_a_dependency_outside_the_creators_scopes_is_404(make_agent, api_for):
    hidden, _ = queue.create(queue="secret")
    api = api_for(make_agent("narrow", claim=["open.*"], create=["open.*"]))
    response = api.post("/todos/", {"queue": "open.q", "depends_on": [hidden.id]})
    assert response.status_code == 404 and hidden.id in response.json()["error"]["detail"]
    assert not Todo.objects.filter(queue="open.q").exists()


def test_a_cancelled_dependency_cancels_the_dependent_by_default_over_http(api):
    a, _ = queue.create(queue="kids")
    parent = api.post("/todos/", {"queue": "parents", "depends_on": [a.id]}).json()
    assert api.post(f"/todos/{a.id}/cancel/", {"reason": "dropped"}).status_code == 200
    after = api.get(f"/todos/{parent['id']}/").json()
    assert after["state"] == TodoState.CANCELLED and after["errors"][-1]["dependency"] == a.id
    assert after["dependencies"][0]["state"] == "cancelled"


_ITEMS = [
    {"queue": "q"},
    {"queue": "q", "kind": "k", "title": "t", "source": "s", "payload": [1, {"a": None}], "priority": -100},
    {"queue": "q", "idempotency_key": "k", "assignee": "bob", "max_attempts": 100, "delay_seconds": 5},
    {"queue": "q", "depends_on": ["td_" + "1" * 32], "on_dependency_failure": "run", "depends_on_index": []},
    {"queue": " q "},
    {"queue": "q", "title": " padded "},
    {"queue": "q", "kind": 5},
    {"queue": "q", "max_attempts": "5"},
    {"queue": "q", "max_attempts": 5.0},
    {"queue": "q", "priority": True},
    {"queue": "q", "priority": 101},
    {"queue": "q", "payload": None},
    {"queue": "q", "payload": {"s": "nul\u0000"}},
    {"queue": "q", "idempotency_key": ""},
    {"queue": "q", "idempotency_key": None},
    {"queue": "q", "delay_seconds": -1},
    {"queue": "q", "delay_seconds": 1e12},
    {"queue": "q", "run_at": "2030-01-01T00:00:00Z"},
    {"queue": "q", "run_at": None, "delay_seconds": 0},
    {"queue": "q", "depends_on": [""]},
    {"queue": "q", "depends_on": ["x" * 41]},
    {"queue": "q", "depends_on_index": ["0"]},
    {"queue": "q", "depends_on_index": [0] * 60, "depends_on": ["td_x"] * 41},
    {"queue": "q", "on_dependency_failure": "ignore"},
    {"queue": "q", "titel": "typo"},
    {"queue": "q", "title": "x" * 501},
    {"queue": "q", "title": "lone \ud800"},
    {"queue": "q\n"},
    {"queue": "q", "fair_key": " spaced "},
    {"queue": "q", "payload": {"k": float("inf")}},
    {"queue": "q", "payload": {"nul\u0000key": 1}},
    {"queue": "q", "payload": {"s": "a backslash then u0000: \\u0000"}},
    {"queue": "q", "payload": {"s": "lone \udc00"}},
    {"queue": "q", "on_dependency_failure": ["run"]},
    {"queue": "q", "depends_on": "td_x"},
    {"queue": "q", "depends_on": [None]},
    {"queue": "q", "traceparent": None, "run_at": None},
]


@pytest.mark.parametrize("item", _ITEMS)
def test_the_batch_fast_path_agrees_with_the_serializer(item):
    from todos.api.batch import fast_item
    from todos.api.serializers import BatchCreateItemInput

    serializer = BatchCreateItemInput(data=item)
    fast = fast_item(item)
    if fast is not None:  # the fast path decides only what the serializer accepts, with the same values
        assert serializer.is_valid(), serializer.errors
        assert fast == dict(serializer.validated_data)


def test_plain_items_take_the_fast_path():
    from todos.api.batch import fast_item

    assert all(fast_item(item) is not None for item in _ITEMS[:4])
    assert fast_item({"queue": "q", "fair_key": " spaced "}) == {**fast_item({"queue": "q"}), "fair_key": " spaced "}


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_batch_keeps_each_items_fair_key_and_traceparent_and_refuses_a_malformed_traceparent(api):
    body = {
        "todos": [
            {"queue": "fair", "fair_key": "acme"},  # the fast path
            {"queue": "fair", "fair_key": " spaced ", "traceparent": TRACEPARENT},  # through the serializer
            {"queue": "fair"},
        ]
    }
    response = api.post("/todos/batch/", body)
    assert response.status_code == 200, response.json()
    made = [Todo.objects.get(pk=o["id"]) for o in response.json()["outcomes"]]
    assert [t.fair_key for t in made] == ["acme", " spaced ", ""]
    assert made[1].traceparent == TRACEPARENT
    refused = api.post("/todos/batch/", {"todos": [{"queue": "fair"}, {"queue": "fair", "traceparent": "00-zz"}]})
    assert refused.status_code == 400 and set(refused.json()["error"]["fields"]) == {"todos.1.traceparent"}
    assert Todo.objects.count() == 3


def test_the_batch_answer_has_the_shape_docs_api_md_gives_it(api):
    from pathlib import Path

    from django.conf import settings

    docs = " ".join((Path(settings.BASE_DIR) / "docs" / "api.md").read_text().split())  # lines wrap anywhere
    # docs/api.md: 'one outcome per item, in order: `{"status": 201, "id", "state"}` for a new todo,
    # `{"status": 200, "id", "state"}` for the runnable todo that already held its idempotency key'
    documented = re.findall(r'`\{"status": (\d{3}), ((?:"\w+"(?:, )?)+)\}`', docs)
    assert {status for status, _ in documented} == {"201", "200"}
    keys = {frozenset(["status", *re.findall(r'"(\w+)"', rest)]) for _, rest in documented}
    assert keys == {frozenset({"status", "id", "state"})}
    todos = [{"queue": "shape", "idempotency_key": "held"}, {"queue": "shape", "idempotency_key": "held"}]
    response = api.post("/todos/batch/", {"todos": todos})
    body = response.json()
    assert response.status_code == 200 and list(body) == ["outcomes"]
    assert [set(o) for o in body["outcomes"]] == [set(*keys)] * 2
    assert [o["status"] for o in body["outcomes"]] == [201, 200] and body["outcomes"][0]["id"] == body["outcomes"][1][
        "id"
    ]
    assert {o["state"] for o in body["outcomes"]} == {"pending"}


def test_a_batch_item_outside_the_creators_scopes_refuses_the_batch_naming_it(make_agent, api_for):
    api = api_for(make_agent("narrow", claim=["open.*"], create=["open.*"]))
    todos = [{"queue": "open.a"}, {"queue": "open.a"}, {"queue": "secret"}, {"queue": "open.a"}]
    response = api.post("/todos/batch/", {"todos": todos})
    assert response.status_code == 400 and set(response.json()["error"]["fields"]) == {"todos.2.queue"}
    assert _nothing_written()


def test_a_batch_item_keeps_every_field_it_gives(api):
    item = {
        "queue": "every",
        "kind": "k",
        "title": "Ünïcode title",
        "source": "s",
        "payload": {"list": [1, 2.5, None, True], "text": 'back\\slash "quoted"'},
        "idempotency_key": "key",
        "assignee": "bob",
        "max_attempts": 7,
        "delay_seconds": 600,
        "priority": -3,
        "fair_key": "tenant",
    }
    response = api.post("/todos/batch/", {"todos": [item, {"queue": "every", "payload": [], "max_attempts": None}]})
    assert response.status_code == 200, response.json()
    first, second = (Todo.objects.get(pk=o["id"]) for o in response.json()["outcomes"])
    assert {name: getattr(first, name) for name in item if name != "delay_seconds"} == {
        k: v for k, v in item.items() if k != "delay_seconds"
    }
    assert first.state == TodoState.SCHEDULED and 590 < (first.run_at - first.created_at).total_seconds() <= 600
    assert (second.payload, second.max_attempts, second.kind, second.fair_key) == ([], 5, "", "")
    assert second.state == TodoState.PENDING and second.on_dependency_failure == "cancel"


def test_a_batch_keeps_scalar_payloads_as_given(api):
    payloads = [0, False, "text", 2.5, [], {}]
    response = api.post("/todos/batch/", {"todos": [{"queue": "scalars", "payload": p} for p in payloads]})
    assert response.status_code == 200, response.json()
    made = [Todo.objects.get(pk=o["id"]).payload for o in response.json()["outcomes"]]
    assert made == payloads


def test_the_fast_path_gives_each_item_its_own_default_payload():
    from todos.api.batch import fast_item

    first, second = fast_item({"queue": "q"}), fast_item({"queue": "q"})
    assert first is not None and second is not None
    assert first["payload"] == second["payload"] == {} and first["payload"] is not second["payload"]
