"""Every verb of the todos API through HTTP: success, the stored row after it, and each error code."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now

from todos.models import Todo, TodoState


def _claim(api, **body):
    response = api.post("/todos/claim/", body)
    assert response.status_code == 200, response.json()
    return response.json()["todos"]


@pytest.fixture
def claimed(api, make_todo):
    make_todo("q", payload={"n": 1})
    [todo] = _claim(api, lease_seconds=60)
    return todo


def test_create_answers_201_and_stores_the_todo(api):
    response = api.post("/todos/", {"queue": "q", "kind": "k", "title": "t", "payload": {"a": 1}})
    assert response.status_code == 201
    body = response.json()
    assert body["created"] is True and body["state"] == "pending" and body["dead_letter"] is False
    todo = Todo.objects.get(pk=body["id"])
    assert (todo.queue, todo.kind, todo.title, todo.payload) == ("q", "k", "t", {"a": 1})


def test_create_with_a_held_key_answers_200_with_the_existing_todo(api):
    first = api.post("/todos/", {"queue": "q", "idempotency_key": "k1"}).json()
    response = api.post("/todos/", {"queue": "q", "idempotency_key": "k1", "title": "again"})
    assert response.status_code == 200
    assert response.json()["created"] is False and response.json()["id"] == first["id"]
    assert Todo.objects.count() == 1


def test_create_outside_the_create_scopes_is_invalid_and_stores_nothing(make_agent, api_for):
    api = api_for(make_agent("narrow", claim=["a.*"], create=["a.*"]))
    response = api.post("/todos/", {"queue": "b.x"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert "queue" in response.json()["error"]["fields"]
    assert not Todo.objects.exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "queue"),
        ({"queue": "bad queue"}, "queue"),
        ({"queue": "q", "title": "x" * 501}, "title"),
        ({"queue": "q", "max_attempts": 0}, "max_attempts"),
        ({"queue": "q", "payload": {"s": "nul\u0000"}}, "payload"),
        ({"queue": "q", "kind": "nul\u0000"}, "kind"),
    ],
)
def test_create_with_invalid_input_is_invalid_with_field_errors(api, body, field):
    response = api.post("/todos/", body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid" and field in error["fields"]
    assert not Todo.objects.exists()


def test_create_with_a_payload_over_the_limit_is_too_large(api, settings):
    settings.MAX_PAYLOAD_BYTES = 1000
    response = api.post("/todos/", {"queue": "q", "payload": {"blob": "x" * 1000}})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"
    assert not Todo.objects.exists()


def test_a_body_over_the_request_limit_is_too_large(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2000
    response = api.post("/todos/", {"queue": "q", "title": "t", "payload": {"blob": "x" * 3000}})
    assert response.status_code == 413
    assert response.json() == {"error": {"code": "too_large", "detail": "The request body is too large."}}
    assert not Todo.objects.exists()


def test_unparseable_json_is_invalid(api):
    response = api.post("/todos/", b"{not json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid"


def test_deeply_nested_json_is_invalid_not_a_crash(api):
    response = api.post("/todos/", b"[" * 100_000 + b"]" * 100_000)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid"


@pytest.mark.parametrize("number", [b"1e400", b"-1e400"])
def test_a_non_finite_number_in_a_payload_is_invalid(api, number):
    response = api.post("/todos/", b'{"queue": "q", "payload": {"x": ' + number + b"}}")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid"


def test_list_filters_by_queue_state_kind_assignee_and_dead(api, make_todo):
    a = make_todo("a", kind="x")
    b = make_todo("b", kind="y", assignee="alice")
    c = make_todo("c", state=TodoState.FAILED, next_retry_at=None)
    d = make_todo("c", state=TodoState.FAILED, next_retry_at=Now() + timedelta(hours=1))

    def ids(**params):
        response = api.get("/todos/", **params)
        assert response.status_code == 200
        return {t["id"] for t in response.json()["results"]}

    assert ids() == {a.id, b.id, c.id, d.id}
    assert ids(queue="a") == {a.id}
    assert ids(kind="y") == {b.id}
    assert ids(assignee="alice") == {b.id}
    assert ids(state="failed") == {c.id, d.id}
    assert ids(dead="true") == {c.id}
    assert ids(dead="false") == {a.id, b.id, d.id}


def test_list_paginates_with_a_cursor_newest_first(api, make_todo):
    made = [make_todo("q", created_at=Now() - timedelta(seconds=10 - i)).id for i in range(5)]
    first = api.get("/todos/", page_size=3).json()
    assert [t["id"] for t in first["results"]] == made[::-1][:3]
    second = api.client.get(first["next"]).json()
    assert [t["id"] for t in second["results"]] == made[::-1][3:]
    assert second["next"] is None


def test_list_with_a_bad_filter_is_invalid(api):
    response = api.get("/todos/", state="sleeping")
    assert response.status_code == 400 and "state" in response.json()["error"]["fields"]


def test_detail_answers_the_todo_with_dead_letter(api, make_todo):
    todo = make_todo("q", state=TodoState.FAILED, next_retry_at=None)
    body = api.get(f"/todos/{todo.id}/").json()
    assert body["id"] == todo.id and body["state"] == "failed" and body["dead_letter"] is True


@pytest.mark.parametrize("todo_id", ["td_00000000000000000000000000000000", "x%00y", "a" * 60])
def test_detail_of_an_unknown_id_is_not_found(api, todo_id):
    response = api.get(f"/todos/{todo_id}/")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_claim_next_claims_the_oldest_with_owner_from_the_token_and_worker(api, make_todo):
    old = make_todo("q", created_at=Now() - timedelta(seconds=5))
    make_todo("q")
    [todo] = _claim(api, worker="host-1", lease_seconds=30)
    assert todo["id"] == old.id and todo["state"] == "claimed" and todo["lease_id"]
    old.refresh_from_db()
    assert old.state == TodoState.CLAIMED and old.owner == "alice/host-1" and old.attempt == 1
    assert timedelta(seconds=25) < old.lease_expires_at - old.claimed_at <= timedelta(seconds=30)


def test_claim_next_refuses_an_owner_in_the_body(api, make_todo):
    # The owner is the authenticated agent's name, never the body's (SPEC decision 6): the field is unknown.
    todo = make_todo("q")
    response = api.post("/todos/claim/", {"owner": "mallory"})
    assert response.status_code == 400 and list(response.json()["error"]["fields"]) == ["owner"]
    todo.refresh_from_db()
    assert todo.owner is None and todo.state == TodoState.PENDING


def test_claim_next_takes_a_batch_up_to_limit_and_answers_an_empty_list_when_none(api, make_todo):
    for _ in range(3):
        make_todo("q")
    assert len(_claim(api, limit=2)) == 2
    assert len(_claim(api, limit=5)) == 1
    assert _claim(api) == []


def test_claim_next_narrows_to_the_queues_asked_for(api, make_todo):
    make_todo("a.1")
    b = make_todo("b.1")
    [todo] = _claim(api, queues=["b.*"])
    assert todo["id"] == b.id


@pytest.mark.parametrize(
    "body, field",
    [
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"lease_seconds": 0.5}, "lease_seconds"),
        ({"lease_seconds": 12 * 3600 + 1}, "lease_seconds"),
        ({"wait_seconds": 21}, "wait_seconds"),
        ({"wait_seconds": -1}, "wait_seconds"),
        ({"worker": "a b"}, "worker"),
        ({"queues": ["bad queue"]}, "queues"),
        ({"queues": "q"}, "queues"),
    ],
)
def test_claim_next_out_of_bounds_is_invalid(api, make_todo, body, field):
    todo = make_todo("q")
    response = api.post("/todos/claim/", body)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    todo.refresh_from_db()
    assert todo.state == TodoState.PENDING


def test_claim_one_claims_it(api, make_todo):
    todo = make_todo("q")
    response = api.post(f"/todos/{todo.id}/claim/", {"lease_seconds": 10, "worker": "w"})
    assert response.status_code == 200 and response.json()["lease_id"]
    todo.refresh_from_db()
    assert todo.state == TodoState.CLAIMED and todo.owner == "alice/w"


def test_claim_one_that_is_claimed_is_conflict_with_its_state(api, claimed):
    response = api.post(f"/todos/{claimed['id']}/claim/")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "conflict" and response.json()["error"]["state"] == "claimed"


def test_claim_one_unknown_is_not_found(api):
    assert api.post("/todos/td_00000000000000000000000000000000/claim/").status_code == 404


def test_heartbeat_extends_the_lease(api, claimed):
    response = api.post(f"/todos/{claimed['id']}/heartbeat/", {"lease_id": claimed["lease_id"], "lease_seconds": 3600})
    assert response.status_code == 200
    todo = Todo.objects.get(pk=claimed["id"])
    assert todo.lease_expires_at - todo.updated_at > timedelta(seconds=3500)


def test_heartbeat_without_lease_id_is_invalid(api, claimed):
    response = api.post(f"/todos/{claimed['id']}/heartbeat/", {})
    assert response.status_code == 400 and "lease_id" in response.json()["error"]["fields"]


def test_complete_stores_the_result(api, claimed):
    response = api.post(f"/todos/{claimed['id']}/complete/", {"lease_id": claimed["lease_id"], "result": {"ok": 1}})
    assert response.status_code == 200 and response.json()["state"] == "done"
    todo = Todo.objects.get(pk=claimed["id"])
    assert todo.state == TodoState.DONE and todo.result == {"ok": 1} and todo.lease_id is None


def test_complete_twice_is_conflict_with_the_state(api, claimed):
    body = {"lease_id": claimed["lease_id"]}
    api.post(f"/todos/{claimed['id']}/complete/", body)
    response = api.post(f"/todos/{claimed['id']}/complete/", body)
    assert response.status_code == 409
    assert response.json()["error"]["state"] == "done"


def test_complete_with_a_result_over_the_limit_is_too_large_and_changes_nothing(api, claimed, settings):
    settings.MAX_PAYLOAD_BYTES = 100
    response = api.post(f"/todos/{claimed['id']}/complete/", {"lease_id": claimed["lease_id"], "result": "x" * 200})
    assert response.status_code == 413 and response.json()["error"]["code"] == "too_large"
    assert Todo.objects.get(pk=claimed["id"]).state == TodoState.CLAIMED


def test_batch_complete_answers_one_outcome_per_item(api, make_todo, make_agent):
    make_todo("q")
    make_todo("q")
    first, second = _claim(api, limit=2)
    response = api.post(
        "/todos/complete/",
        {
            "items": [
                {"id": first["id"], "lease_id": first["lease_id"], "result": {"n": 1}},
                {"id": second["id"], "lease_id": "ls_wrong"},
                {"id": "td_00000000000000000000000000000000", "lease_id": "ls_x"},
            ]
        },
    )
    assert response.status_code == 200
    outcomes = response.json()["outcomes"]
    assert [o["status"] for o in outcomes] == [200, 409, 404]
    assert outcomes[0]["todo"]["state"] == "done"
    assert outcomes[1]["error"]["code"] == "conflict" and outcomes[1]["error"]["state"] == "claimed"
    assert outcomes[2]["error"]["code"] == "not_found"
    assert Todo.objects.get(pk=first["id"]).result == {"n": 1}
    assert Todo.objects.get(pk=second["id"]).state == TodoState.CLAIMED


@pytest.mark.parametrize("items", [[], [{"id": "x", "lease_id": "y"}] * 101, "nope"])
def test_batch_complete_with_no_or_too_many_items_is_invalid(api, items):
    response = api.post("/todos/complete/", {"items": items})
    assert response.status_code == 400 and "items" in response.json()["error"]["fields"]


def test_fail_schedules_a_retry_and_records_the_error(api, claimed):
    response = api.post(
        f"/todos/{claimed['id']}/fail/", {"lease_id": claimed["lease_id"], "error": "boom", "retry_in_seconds": 30}
    )
    assert response.status_code == 200
    todo = Todo.objects.get(pk=claimed["id"])
    assert todo.state == TodoState.FAILED and todo.next_retry_at is not None and not todo.is_dead_letter
    assert todo.errors[-1]["error"] == "boom"


def test_fail_at_the_cap_dead_letters(api, make_todo):
    make_todo("q", max_attempts=1)
    [todo] = _claim(api)
    body = api.post(f"/todos/{todo['id']}/fail/", {"lease_id": todo["lease_id"], "error": "x"}).json()
    assert body["state"] == "failed" and body["dead_letter"] is True


def test_fail_with_an_error_over_the_limit_is_invalid(api, claimed):
    response = api.post(f"/todos/{claimed['id']}/fail/", {"lease_id": claimed["lease_id"], "error": "x" * 10_001})
    assert response.status_code == 400 and "error" in response.json()["error"]["fields"]
    assert Todo.objects.get(pk=claimed["id"]).state == TodoState.CLAIMED


def test_release_gives_the_todo_and_the_attempt_back(api, claimed):
    response = api.post(f"/todos/{claimed['id']}/release/", {"lease_id": claimed["lease_id"]})
    assert response.status_code == 200
    todo = Todo.objects.get(pk=claimed["id"])
    assert todo.state == TodoState.PENDING and todo.attempt == 0 and todo.lease_id is None
    assert todo.owner == "alice"  # last claimed by, as after a lapse


def test_release_with_a_stale_receipt_is_conflict(api, claimed):
    response = api.post(f"/todos/{claimed['id']}/release/", {"lease_id": "ls_stale"})
    assert response.status_code == 409 and response.json()["error"]["state"] == "claimed"


@pytest.fixture
def dead(make_todo):
    return make_todo("q", state=TodoState.FAILED, next_retry_at=None, attempt=5, max_attempts=5)


@pytest.mark.parametrize("mode, attempt, max_attempts", [("reset", 0, 5), ("once", 5, 6)])
def test_retry_by_a_permitted_agent_requeues_the_dead_letter(make_agent, api_for, dead, mode, attempt, max_attempts):
    api = api_for(make_agent("ops", can_retry_dead_letters=True))
    response = api.post(f"/todos/{dead.id}/retry/", {"mode": mode, "note": "db was down"})
    assert response.status_code == 200
    dead.refresh_from_db()
    assert (dead.state, dead.attempt, dead.max_attempts) == (TodoState.PENDING, attempt, max_attempts)
    assert dead.errors[-1]["operator"] == "ops" and dead.errors[-1]["note"] == "db was down"


def test_retry_by_staff_on_a_session_works(dead, django_user_model, client):
    client.force_login(django_user_model.objects.create_user("root", is_staff=True, is_superuser=True))
    response = client.post(f"/api/v1/todos/{dead.id}/retry/", {"mode": "reset"}, content_type="application/json")
    assert response.status_code == 200
    dead.refresh_from_db()
    assert dead.state == TodoState.PENDING and dead.errors[-1]["operator"] == "staff:root"


def test_retry_by_an_agent_without_the_right_is_forbidden(api, dead):
    response = api.post(f"/todos/{dead.id}/retry/", {"mode": "reset"})
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    dead.refresh_from_db()
    assert dead.state == TodoState.FAILED


def test_retry_of_a_todo_that_is_not_dead_is_conflict(make_agent, api_for, make_todo):
    todo = make_todo("q")
    api = api_for(make_agent("ops", can_retry_dead_letters=True))
    response = api.post(f"/todos/{todo.id}/retry/", {"mode": "reset"})
    assert response.status_code == 409 and response.json()["error"]["state"] == "pending"


def test_retry_with_a_bad_mode_is_invalid(make_agent, api_for, dead):
    api = api_for(make_agent("ops", can_retry_dead_letters=True))
    response = api.post(f"/todos/{dead.id}/retry/", {"mode": "twice"})
    assert response.status_code == 400 and "mode" in response.json()["error"]["fields"]


def test_queues_counts_each_live_state_and_the_oldest_pending_age(api, make_todo):
    make_todo("a", created_at=Now() - timedelta(seconds=30))
    make_todo("a")
    make_todo("a", state=TodoState.CLAIMED, lease_expires_at=Now() + timedelta(minutes=1))
    make_todo("a", state=TodoState.FAILED, next_retry_at=Now() + timedelta(minutes=1))
    make_todo("a", state=TodoState.FAILED, next_retry_at=None)
    make_todo("a", state=TodoState.DONE)
    make_todo("b", state=TodoState.DONE)
    response = api.get("/queues/")
    assert response.status_code == 200
    a, b = response.json()["queues"]
    assert a["queue"] == "a" and b["queue"] == "b"
    assert (a["pending"], a["claimed"], a["failed"], a["retry_waiting"], a["dead_letters"]) == (2, 1, 2, 1, 1)
    assert 29 < a["oldest_pending_age_seconds"] < 60
    assert (b["pending"], b["claimed"], b["failed"], b["oldest_pending_age_seconds"]) == (0, 0, 0, None)


def test_queues_reads_through_the_partial_indexes_in_one_query(api, make_todo, django_assert_num_queries):
    make_todo("a")
    with django_assert_num_queries(2):  # the agent's token lookup, then the one aggregate
        assert api.get("/queues/").status_code == 200


@pytest.mark.parametrize(
    "method, path",
    [
        ("get", "/todos/"),
        ("post", "/todos/"),
        ("get", "/todos/td_1/"),
        ("post", "/todos/claim/"),
        ("post", "/todos/td_1/claim/"),
        ("post", "/todos/td_1/heartbeat/"),
        ("post", "/todos/td_1/complete/"),
        ("post", "/todos/complete/"),
        ("post", "/todos/td_1/fail/"),
        ("post", "/todos/td_1/release/"),
        ("post", "/todos/td_1/retry/"),
        ("get", "/queues/"),
    ],
)
@pytest.mark.parametrize("token", [None, "sb_unknown", "inactive"])
def test_every_endpoint_without_a_valid_token_is_unauthorized(make_agent, method, path, token):
    from todos.tests.conftest import Api

    if token == "inactive":
        agent = make_agent("sleepy", is_active=False)
        token = agent.token
    api = Api(token)
    response = getattr(api, method)(path)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_no_plaintext_token_is_stored_anywhere(make_agent, api_for):
    agent = make_agent("tokenholder")
    api_for(agent).post("/todos/", {"queue": "q"})
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND data_type IN ('text', 'character varying', 'jsonb', 'json')"
        )
        columns = cursor.fetchall()
        hits = []
        for table, column in columns:
            cursor.execute(
                f'SELECT count(*) FROM "{table}" WHERE "{column}"::text LIKE %s',
                [f"%{agent.token[3:]}%"],
            )
            if cursor.fetchone()[0]:
                hits.append((table, column))
    assert hits == []
    assert Todo.objects.count() == 1  # the request did go through


def test_the_fast_todo_rendering_matches_the_declared_serializer(make_todo):
    from rest_framework import serializers as drf

    from todos.api.serializers import TodoSerializer

    todo = make_todo("q", state=TodoState.FAILED, next_retry_at=Now() + timedelta(seconds=5), result={"r": 1})
    todo.refresh_from_db()
    fast = TodoSerializer(todo).data
    slow = drf.ModelSerializer.to_representation(TodoSerializer(), todo)
    assert dict(fast) == dict(slow)
    assert list(fast) == list(TodoSerializer().fields)


@pytest.mark.parametrize("path", ["/api/v1/todos/", "/api/v1/queues/", "/api/v1/todos/claim/"])
def test_staff_browse_the_api_in_a_browser(path, django_user_model, client, make_todo):
    todo = make_todo("q")
    client.force_login(django_user_model.objects.create_user("root", is_staff=True, is_superuser=True))
    response = client.get(path, headers={"accept": "text/html"})
    assert response.status_code in (200, 405)
    assert response["Content-Type"].startswith("text/html")
    assert client.get(f"/api/v1/todos/{todo.id}/", headers={"accept": "text/html"}).status_code == 200


def test_a_non_staff_session_user_is_unauthorized(django_user_model, client):
    client.force_login(django_user_model.objects.create_user("visitor"))
    response = client.get("/api/v1/todos/")
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"
