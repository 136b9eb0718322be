"""One contract: the client's verbs and models against the server's OpenAPI schema (/api/schema/). A
field, parameter or operation the API adds and the client lacks fails here."""

from __future__ import annotations

import inspect
import json

import pytest
from django.test import Client as DjangoClient
from switchboard_client import AsyncClient, Client, _api, errors, models

pytestmark = pytest.mark.django_db

# Placeholder arguments for a builder's required parameters, by name: a path segment "X".
_ARGS = {"items": [], "todos": [], "priority": 0, "lease_id": "ls_X", "timeout_seconds": 60, "budget": {"cost_usd": 1}}
# Keywords a builder needs beyond its required ones: a wait waits for exactly one thing.
_CHOICES = {"todos_wait": {"token": True}}


@pytest.fixture(scope="module")
def spec(django_db_setup, django_db_blocker) -> dict:
    with django_db_blocker.unblock():
        response = DjangoClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return json.loads(response.content)


def _operations(spec: dict) -> dict[str, tuple[str, str, dict]]:
    return {
        op["operationId"]: (method.upper(), path, op)
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if path.startswith("/api/v1/")
    }


def _component(spec: dict, ref_holder: dict) -> dict:
    schema = ref_holder["content"]["application/json"]["schema"]
    return spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]


def _keywords(builder) -> set[str]:
    return {p.name for p in inspect.signature(builder).parameters.values() if p.kind is p.KEYWORD_ONLY} | {
        p.name for p in inspect.signature(builder).parameters.values() if p.default is not p.empty
    }


def test_every_operation_of_the_api_has_a_verb_in_both_clients(spec):
    missing = sorted(set(_operations(spec)) - set(_api.OPERATIONS))
    assert missing == [], f"operations without a client verb: {missing}"
    for op, builder in _api.OPERATIONS.items():
        assert op in _operations(spec), f"{builder.__name__} names an operation the API lacks: {op}"
        assert callable(getattr(Client, builder.__name__)), builder.__name__
        assert inspect.iscoroutinefunction(getattr(AsyncClient, builder.__name__)), builder.__name__


@pytest.mark.parametrize("op", sorted(_api.OPERATIONS))
def test_each_verb_sends_the_operations_method_path_and_every_field(spec, op):
    method, path, operation = _operations(spec)[op]
    builder = _api.OPERATIONS[op]
    required = [
        p
        for p in inspect.signature(builder).parameters.values()
        if p.kind is not p.KEYWORD_ONLY and (p.default is p.empty or p.name == "lease_id")
    ]
    keywords = {
        p.name: _ARGS.get(p.name, "X")
        for p in inspect.signature(builder).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.default is p.empty
    }
    call = builder(*[_ARGS.get(p.name, "X") for p in required], **keywords, **_CHOICES.get(op, {}))
    assert call.op == op and call.method == method
    expected = path
    for parameter in (p for p in operation.get("parameters", []) if p["in"] == "path"):
        expected = expected.replace("{" + parameter["name"] + "}", "X")
    assert "/api/v1/" + call.path == expected

    given = {p.name for p in required} | _keywords(builder)
    queries = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
    assert queries <= given, f"{op}: query parameters the client cannot send: {sorted(queries - given)}"
    if "requestBody" in operation:
        body = _component(spec, operation["requestBody"])
        fields = set(body.get("properties", {}))
        if op == "todos_complete_many":  # items: (todo, lease_id, result) tuples
            item = spec["components"]["schemas"][body["properties"]["items"]["items"]["$ref"].rsplit("/", 1)[1]]
            assert set(item["properties"]) == {"id", "lease_id", "result"}
            fields -= {"items"}
        if op == "todos_wait":  # "for" (a keyword in Python): exactly one of todos=, event=, token=
            assert {"todos", "event", "token"} <= given
            fields -= {"for"}
        assert fields <= given, f"{op}: body fields the client cannot send: {sorted(fields - given)}"


def _models() -> list[type[models.Model]]:
    found, todo = [], [models.Model]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return [m for m in found if m.schema]


@pytest.mark.parametrize("model", _models(), ids=lambda m: m.__name__)
def test_each_model_has_exactly_the_fields_of_its_schema_component(spec, model):
    component = spec["components"]["schemas"][model.schema]
    assert set(model.json_fields()) == set(component["properties"]), model.schema


def test_every_object_the_api_answers_with_has_a_model(spec):
    modelled = {m.schema for m in _models()}
    answered = set()
    for _, _, operation in _operations(spec).values():
        for status, response in operation["responses"].items():
            if status.startswith("2") and "content" in response:
                schema = response["content"]["application/json"]["schema"]
                ref = schema.get("$ref") or schema.get("items", {}).get("$ref")
                if ref:
                    answered.add(ref.rsplit("/", 1)[1])
    # Envelopes the client unwraps into lists and pages of the modelled objects.
    envelopes = {
        "Claimed",
        "QueueList",
        "ScheduleList",
        "BatchCompleteResult",
        "BatchCreateResult",
        "PaginatedTodoList",
    }
    envelopes |= {"PaginatedEventSummaryList"}
    assert answered - envelopes <= modelled, sorted(answered - envelopes - modelled)
    for envelope in envelopes & answered:
        for prop in spec["components"]["schemas"][envelope]["properties"].values():
            ref = prop.get("$ref") or prop.get("items", {}).get("$ref")
            assert ref is None or ref.rsplit("/", 1)[1] in modelled, (envelope, ref)


def test_every_error_code_of_the_api_has_its_exception(spec):
    codes = set(spec["components"]["schemas"]["CodeEnum"]["enum"])
    assert codes <= set(errors.BY_CODE), sorted(codes - set(errors.BY_CODE))


def test_the_workers_batch_sizes_are_the_servers_bounds(spec):
    # The worker claims and completes in batches as large as the server takes (todos/limits.py; the claim's is
    # published in the schema): a smaller one costs round trips, a larger one is a 400.
    from switchboard_client import worker

    from todos import limits

    assert worker.MAX_CLAIM == spec["components"]["schemas"]["ClaimNextInputRequest"]["properties"]["limit"]["maximum"]
    assert worker.MAX_CLAIM == limits.MAX_CLAIM_BATCH
    assert worker.MAX_BATCH == limits.MAX_COMPLETE_BATCH
