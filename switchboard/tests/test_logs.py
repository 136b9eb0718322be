"""Request ids and structured request logs, and what must never reach a log: tokens, payloads, cookies."""

from __future__ import annotations

import io
import json
import logging

import pytest
from django.test import Client

from switchboard.logs import JsonFormatter, RequestIdFilter, logging_config

SECRET_PAYLOAD = "payload-marker-7f3a91"


@pytest.fixture
def captured():
    """Every record from every logger, rendered by both production formatters."""
    streams = {"json": io.StringIO(), "plain": io.StringIO()}
    plain_format = logging_config("plain", "INFO")["formatters"]["switchboard"]["format"]
    handlers = []
    for kind, stream in streams.items():
        handler = logging.StreamHandler(stream)
        handler.setFormatter(JsonFormatter() if kind == "json" else logging.Formatter(plain_format))
        handler.addFilter(RequestIdFilter())
        handler.setLevel(logging.DEBUG)
        handlers.append(handler)
    root = logging.getLogger()
    watched = [root, logging.getLogger("django.request"), logging.getLogger("switchboard.request")]
    levels = [logger.level for logger in watched]
    for logger in watched:
        logger.setLevel(logging.DEBUG)
    for handler in handlers:
        root.addHandler(handler)
    yield streams
    for handler in handlers:
        root.removeHandler(handler)
    for logger, level in zip(watched, levels, strict=True):
        logger.setLevel(level)


def _json_lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]


def test_a_valid_request_id_is_kept_echoed_and_logged(client, db, captured):
    response = client.get("/healthz", HTTP_X_REQUEST_ID="lb-1234.abc")
    assert response["X-Request-ID"] == "lb-1234.abc"
    [line] = [e for e in _json_lines(captured["json"]) if e.get("event") == "request"]
    assert line["request_id"] == "lb-1234.abc"
    assert line["route"] == "healthz" and line["status"] == 200 and line["method"] == "GET"
    assert isinstance(line["duration_ms"], float)


@pytest.mark.parametrize("given", ["", "x" * 129, "has space", "new\nline", 'quote"d', "ünïcode"])
def test_an_invalid_request_id_is_replaced_by_a_generated_one(client, db, given):
    response = client.get("/healthz", HTTP_X_REQUEST_ID=given)
    generated = response["X-Request-ID"]
    assert generated != given and len(generated) == 32 and generated.isalnum()


def test_each_request_without_an_id_gets_its_own(client, db):
    assert client.get("/healthz")["X-Request-ID"] != client.get("/healthz")["X-Request-ID"]


def test_health_probes_are_logged_below_info(client, db, caplog):
    caplog.set_level(logging.INFO, logger="switchboard.request")
    client.get("/healthz")
    client.get("/no-such-page")
    routes = [getattr(r, "fields", {}).get("route") for r in caplog.records if r.name == "switchboard.request"]
    assert routes == ["<unmatched>"]


@pytest.mark.urls("switchboard.tests.urls_logging")
def test_logs_never_contain_the_token_payload_or_cookies(db, agent, captured, settings):
    settings.METRICS_TOKEN = "metrics-token-0c9d2e"
    client = Client(raise_request_exception=False)
    client.cookies["sessionid"] = "cookie-marker-55aa"
    auth = {"HTTP_AUTHORIZATION": f"Bearer {agent.token}", "HTTP_X_REQUEST_ID": "redaction-test"}
    body = json.dumps({"queue": "q", "title": SECRET_PAYLOAD, "payload": {"secret": SECRET_PAYLOAD}})

    assert client.post("/test/echo/", body, content_type="application/json", **auth).status_code == 201
    assert client.post("/test/boom/", body, content_type="application/json", **auth).status_code == 500
    # The todos API, where it is installed (404 until then: still a request carrying both).
    client.post("/api/v1/todos/", body, content_type="application/json", **auth)
    client.post("/api/v1/todos/", body, content_type="application/json", HTTP_AUTHORIZATION="Bearer sb_wrongtoken")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer metrics-token-0c9d2e-wrong").status_code == 401

    for kind, stream in captured.items():
        text = stream.getvalue()
        assert "redaction-test" in text, f"{kind}: the requests were not logged at all"
        for secret in (
            agent.token,
            agent.token[3:],
            "sb_wrongtoken",
            "metrics-token-0c9d2e",
            SECRET_PAYLOAD,
            "cookie-marker-55aa",
        ):
            assert secret not in text, f"{kind} log contains {secret!r}"
    echo = [e for e in _json_lines(captured["json"]) if e.get("event") == "request" and e["route"] == "test/echo/"]
    assert echo[0]["agent"] == agent.name and echo[0]["status"] == 201
    errors = [e for e in _json_lines(captured["json"]) if e["level"] == "ERROR"]
    assert errors and errors[0]["request_id"] == "redaction-test"  # the 500's traceback, without the request
