"""The OpenAPI schema: valid OpenAPI 3, every endpoint documented with errors and examples, offline
docs, and a schema-driven fuzz run (schemathesis) that finds no 5xx."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import schemathesis
import yaml
from django.contrib.staticfiles import finders
from django.test import Client
from hypothesis import HealthCheck, given, settings
from openapi_spec_validator import validate
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from switchboard.wsgi import application
from todos import queue

SPEC_PATHS = {
    ("post", "/api/v1/todos/"),
    ("get", "/api/v1/todos/"),
    ("get", "/api/v1/todos/{todo_id}/"),
    ("post", "/api/v1/todos/claim/"),
    ("post", "/api/v1/todos/{todo_id}/claim/"),
    ("post", "/api/v1/todos/{todo_id}/heartbeat/"),
    ("post", "/api/v1/todos/{todo_id}/complete/"),
    ("post", "/api/v1/todos/{todo_id}/fail/"),
    ("post", "/api/v1/todos/{todo_id}/release/"),
    ("post", "/api/v1/todos/{todo_id}/retry/"),
    ("post", "/api/v1/todos/complete/"),
    ("get", "/api/v1/queues/"),
}


@pytest.fixture(scope="module")
def spec() -> dict:
    response = Client().get("/api/schema/")
    assert response.status_code == 200
    return yaml.safe_load(response.content)


def test_schema_is_valid_openapi_3(spec):
    validate(spec)
    assert spec["openapi"].startswith("3.")


def test_schema_documents_every_endpoint_with_bodies_errors_and_examples(spec):
    operations = {(m, p): op for p, item in spec["paths"].items() for m, op in item.items()}
    assert SPEC_PATHS <= set(operations)
    for (method, path), op in operations.items():
        if (method, path) not in SPEC_PATHS:
            continue
        responses = op["responses"]
        ok = [s for s in responses if s.startswith("2")]
        assert ok and all("schema" in responses[s]["content"]["application/json"] for s in ok), (method, path)
        assert {"401", "503"} <= set(responses), (method, path)
        if method == "post" and path != "/api/v1/todos/{todo_id}/claim/":
            assert "400" in responses and "requestBody" in op, (method, path)
        for status, response in responses.items():
            assert response["content"]["application/json"].get("examples"), (method, path, status)
        assert {"bearerAuth": []} in op["security"], (method, path)
    assert spec["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": spec["components"]["securitySchemes"]["bearerAuth"]["description"],
    }


def test_docs_page_serves_its_assets_locally_without_a_cdn():
    response = Client().get("/api/docs/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "cdn" not in page.lower() and "unpkg" not in page.lower()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in page
    assert finders.find("drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
    asset = Client().get("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
    try:
        assert asset.status_code == 200 and b"SwaggerUIBundle" in b"".join(asset.streaming_content)
    finally:
        asset.close()


# --- the fuzz run ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_fuzzing_the_api_finds_no_server_error(transactional_db, make_agent):
    agent = make_agent("fuzzer", claim=["*"], can_retry_dead_letters=True)
    headers = {"Authorization": f"Bearer {agent.token}"}
    # Real rows in every state, so that generated requests also meet existing todos.
    real = [queue.create(queue=f"fuzz.{i}")[0].id for i in range(4)]
    queue.claim(real[1], agent=agent)
    claimed = queue.claim(real[2], agent=agent)
    queue.fail(real[2], agent=agent, lease_id=claimed.lease_id, error="x", retry_in_seconds=3600)
    schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= len(SPEC_PATHS)
    server_errors: list[str] = []
    calls = Counter()

    def fuzz(operation, mode: GenerationMode, **fixed: Any) -> None:
        label = f"{operation.label} ({mode.value}{', real id' if fixed else ''})"

        @given(case=operation.as_strategy(mode, **fixed))
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def call(case) -> None:
            if isinstance(case.body, dict) and isinstance(case.body.get("wait_seconds"), int | float):
                # Long-polls are tested on a live server; here a 20 s wait would only slow the run.
                case.body["wait_seconds"] = min(case.body["wait_seconds"], 0.05)
            response = case.call(headers=headers)
            calls[response.status_code] += 1
            try:
                case.validate_response(response, checks=[not_a_server_error])
            except Exception as exc:  # collect every failing operation, then report them all
                server_errors.append(f"{label}: {exc}")
                raise

        try:
            call()
        except Exception as exc:  # a server error, recorded above; or a failure to generate, recorded here
            if not server_errors or not server_errors[-1].startswith(label):
                server_errors.append(f"{label}: {exc!r}")

    for operation in operations:
        for mode in GenerationMode:
            fuzz(operation, mode)
        if "{todo_id}" in operation.path:
            for todo_id in real:
                fuzz(operation, GenerationMode.POSITIVE, path_parameters={"todo_id": todo_id})
    assert server_errors == []
    assert sum(calls.values()) >= 20 * len(operations), calls
    assert {200, 400, 404, 409} <= set(calls), calls
