"""Redis Stream entries into events and todos (manage.py consume_stream), against a real redis-server:
exact counts with duplicates, bad entries recorded and acked, nothing acked before it is stored."""

from __future__ import annotations

import json
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection

from events.models import Event
from ingest.errors import BodyTooLarge, InvalidDelivery
from ingest.models import Route, Source
from ingest.streams import StreamConsumer, parse_entry
from todos.models import Todo

STREAM, GROUP = "orders", "switchboard"


def drain(redis_server: Any, *extra: str, source: str = "orders-stream") -> None:
    call_command(
        "consume_stream",
        "--redis-url", redis_server.url,
        "--stream", STREAM,
        "--group", GROUP,
        "--source", source,
        "--consumer", "test",
        "--block-ms", "50",
        "--drain",
        *extra,
    )  # fmt: skip


def xadd(client: redis.Redis, event_type: str | None = "order.created", payload: Any = None, **fields: Any) -> str:
    entry: dict[str, Any] = dict(fields)
    if event_type is not None:
        entry["type"] = event_type
    entry["payload"] = payload if isinstance(payload, str | bytes) else json.dumps(payload or {"n": 1})
    return client.xadd(STREAM, entry).decode()


def pending(client: redis.Redis) -> int:
    return int(client.xpending(STREAM, GROUP)["pending"])


@pytest.fixture
def stream_source(make_route: Callable[..., Route]) -> Source:
    source = Source.objects.create(slug="orders-stream", provider="stream")
    make_route(source, "order.*", "orders", kind="fulfil", title_template="Order {id}")
    make_route(source, "order.created", "audit", kind="log")
    return source


# --- Parsing (pure) --------------------------------------------------------------------------------


def test_parse_entry_takes_the_delivery_id_field_or_makes_one_from_the_entry_id():
    fields = {b"type": b"order.created", b"payload": b'{"id": 7}'}
    assert parse_entry("orders", "1-0", fields, max_bytes=1000).delivery_id == "orders:1-0"
    event = parse_entry("orders", "1-0", {**fields, b"delivery_id": b"ord-7"}, max_bytes=1000)
    assert (event.delivery_id, event.event_type, event.payload) == ("ord-7", "order.created", {"id": 7})


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({b"payload": b"{}"}, "no type field"),
        ({b"type": b"", b"payload": b"{}"}, "no type field"),
        ({b"type": b"x"}, "no payload field"),
        ({b"type": b"x", b"payload": b"{not json"}, "The payload field is not valid JSON"),
        ({b"type": b"x", b"payload": b"[1, 2]"}, "The payload field must be a JSON object"),
        ({b"type": b"x", b"payload": b'{"a": "\\u0000"}'}, "\\u0000"),
        ({b"type": b"\xff", b"payload": b"{}"}, "not UTF-8"),
        ({b"type": b"x" * 201, b"payload": b"{}"}, "at most 200"),
        ({}, "gone from the stream"),
    ],
)
def test_parse_entry_refuses_an_entry_that_can_never_be_stored(fields, detail):
    with pytest.raises(InvalidDelivery) as caught:
        parse_entry("orders", "1-0", fields, max_bytes=1000)
    assert detail in str(caught.value.detail)


def test_parse_entry_refuses_an_entry_over_the_size_limit():
    with pytest.raises(BodyTooLarge):
        parse_entry("orders", "1-0", {b"type": b"x", b"payload": b'{"a": "' + b"x" * 100 + b'"}'}, max_bytes=100)


# --- Consuming -------------------------------------------------------------------------------------


# The command commits for real (and closes stale connections between passes): transactional tests.
@pytest.mark.django_db(transaction=True)
def test_consume_stream_makes_one_event_per_delivery_and_acks_the_duplicates(redis_server, redis_client, stream_source):
    for n in range(30):
        xadd(redis_client, payload={"id": n}, delivery_id=f"ord-{n}")
    for n in range(0, 30, 3):  # a producer retrying: the same delivery id again, in later entries
        xadd(redis_client, payload={"id": n}, delivery_id=f"ord-{n}")
    for n in range(5):  # no delivery id: each entry is its own delivery
        xadd(redis_client, "order.shipped", payload={"id": 100 + n})
    drain(redis_server, "--batch", "7")

    assert Event.objects.filter(source="orders-stream").count() == 35
    assert Todo.objects.filter(queue="orders").count() == 35
    assert Todo.objects.filter(queue="audit").count() == 30  # order.created only
    todo = Todo.objects.get(queue="orders", event__delivery_id="ord-4")
    route = stream_source.routes.get(queue="orders")
    assert (todo.title, todo.kind, todo.idempotency_key) == ("Order 4", "fulfil", f"ingest:ord-4:{route.id}")
    shipped = Event.objects.filter(type="order.shipped").order_by("delivery_id").first()
    assert shipped is not None and shipped.delivery_id.startswith(f"{STREAM}:")
    assert shipped.headers["stream"] == STREAM and shipped.headers["entry_id"] == shipped.delivery_id.split(":", 1)[1]
    assert pending(redis_client) == 0
    assert redis_client.xinfo_groups(STREAM)[0]["lag"] == 0


@pytest.mark.django_db(transaction=True)
def test_consume_stream_reading_the_stream_again_makes_nothing_new(redis_server, redis_client, stream_source):
    for n in range(10):
        xadd(redis_client, payload={"id": n})
    drain(redis_server)
    # A new group reads the whole stream from the start: every entry is a duplicate, and acked.
    redis_client.xgroup_destroy(STREAM, GROUP)
    drain(redis_server)
    assert Event.objects.count() == 10 and Todo.objects.count() == 20
    assert pending(redis_client) == 0


@pytest.mark.django_db(transaction=True)
def test_consume_stream_creates_a_missing_stream_and_group(redis_server, redis_client, stream_source):
    drain(redis_server)
    assert redis_client.exists(STREAM)
    assert [g["name"] for g in redis_client.xinfo_groups(STREAM)] == [GROUP.encode()]


@pytest.mark.django_db(transaction=True)
def test_consume_stream_records_and_acks_bad_entries_and_stores_the_good_ones(
    redis_server, redis_client, stream_source, settings
):
    settings.INGEST_MAX_BODY_BYTES = 2000
    good = xadd(redis_client, payload={"id": 1})
    no_type = xadd(redis_client, None, payload={"id": 2}, note="from the billing job")
    not_json = xadd(redis_client, payload="{oops")
    not_object = xadd(redis_client, payload="[1, 2, 3]")
    too_large = xadd(redis_client, payload={"blob": "x" * 3000})
    drain(redis_server)

    assert Event.objects.count() == 1 and Event.objects.get().delivery_id == f"{STREAM}:{good}"
    assert pending(redis_client) == 0
    rejected = {
        fields[b"rejected_entry_id"].decode(): fields for _, fields in redis_client.xrange(f"{STREAM}:rejected")
    }
    assert set(rejected) == {no_type, not_json, not_object, too_large}
    assert rejected[no_type][b"rejected_reason"] == b"invalid"
    assert b"no type field" in rejected[no_type][b"rejected_detail"]
    assert rejected[no_type][b"note"] == b"from the billing job"  # the entry's own fields, for a person to fix
    assert rejected[not_json][b"payload"] == b"{oops"
    assert b"must be a JSON object" in rejected[not_object][b"rejected_detail"]
    assert rejected[too_large][b"rejected_reason"] == b"too_large"
    assert b"payload" not in rejected[too_large]  # what the limit refused is not stored again
    assert rejected[too_large][b"rejected_stream"] == STREAM.encode()


@pytest.mark.django_db(transaction=True)
def test_consume_stream_names_the_rejected_stream_from_the_settings(
    redis_server, redis_client, stream_source, settings
):
    settings.STREAM_REJECTED_STREAM = "dead:{stream}"
    xadd(redis_client, None)
    drain(redis_server)
    assert redis_client.xlen(f"dead:{STREAM}") == 1 and not redis_client.exists(f"{STREAM}:rejected")


@pytest.mark.django_db(transaction=True)
def test_an_entry_a_route_cannot_store_stays_pending_while_the_rest_of_its_batch_is_stored(
    redis_server, redis_client, make_route
):
    source = Source.objects.create(slug="orders-stream", provider="stream")
    make_route(source, "order.created", "orders")
    make_route(source, "order.broken", "not a queue name!")  # bypasses the admin's validation
    xadd(redis_client, payload={"id": 1})
    broken = xadd(redis_client, "order.broken")
    xadd(redis_client, payload={"id": 3})
    drain(redis_server)
    assert Event.objects.count() == 2 and not Event.objects.filter(type="order.broken").exists()
    [entry] = redis_client.xpending_range(STREAM, GROUP, "-", "+", 10)
    assert entry["message_id"].decode() == broken  # retried once idle past --claim-idle-ms, not acked


def _consumer(redis_server: Any, source: str = "orders-stream", **kw: Any) -> StreamConsumer:
    options: dict[str, Any] = {
        "stream": STREAM,
        "group": GROUP,
        "consumer": "c1",
        "source": source,
        "batch": 10,
        "block_ms": 50,
        "claim_idle_ms": 60000,
        "rejected_stream": f"{STREAM}:rejected",
        "rejected_maxlen": 1000,
        "max_bytes": 10000,
    }
    options.update(kw)
    consumer = StreamConsumer(redis_server.client(), **options)
    consumer.ensure_group()
    return consumer


@pytest.mark.django_db(transaction=True)
def test_a_database_error_mid_batch_acks_nothing_and_the_batch_is_read_again(redis_server, redis_client, stream_source):
    for n in range(5):
        xadd(redis_client, payload={"id": n})
    consumer = _consumer(redis_server)
    with connection.cursor() as cursor:
        # A real error from PostgreSQL on the third insert of the batch (as an outage would raise).
        cursor.execute("""
            CREATE FUNCTION refuse_third() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF (SELECT count(*) FROM events_event) >= 2 THEN RAISE EXCEPTION 'down'; END IF; RETURN NEW; END $$;
            CREATE TRIGGER refuse_third BEFORE INSERT ON events_event FOR EACH ROW EXECUTE FUNCTION refuse_third();
        """)
    try:
        with pytest.raises(DatabaseError):
            consumer.run_once()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse_third ON events_event; DROP FUNCTION refuse_third();")
    assert Event.objects.count() == 0  # the whole batch rolled back...
    assert pending(redis_client) == 5  # ...and nothing was acked
    consumer.lost_track()  # what the command's loop does after a failed pass
    result = consumer.run_once()
    assert result is not None and (result.read, result.stored) == (5, 5)
    assert Event.objects.count() == 5 and pending(redis_client) == 0


@pytest.mark.django_db(transaction=True)
def test_an_inactive_source_reads_nothing_and_the_entries_wait(redis_server, redis_client, stream_source):
    Source.objects.filter(pk=stream_source.pk).update(is_active=False)
    xadd(redis_client)
    consumer = _consumer(redis_server)
    assert consumer.run_once() is None
    assert Event.objects.count() == 0 and redis_client.xinfo_groups(STREAM)[0]["lag"] == 1


@pytest.mark.django_db(transaction=True)
def test_consume_stream_refuses_a_source_that_is_not_a_stream(redis_server, make_source):
    make_source("gh", "github")
    with pytest.raises(CommandError, match="of provider 'github', not 'stream'"):
        drain(redis_server, source="gh")
    with pytest.raises(CommandError, match="No source 'nope'"):
        drain(redis_server, source="nope")


@pytest.mark.django_db
def test_a_webhook_post_to_a_stream_source_is_refused_and_stores_nothing(stream_source, post_webhook):
    response = post_webhook("orders-stream", b'{"type": "order.created"}', {"X-Signature-256": "sha256=00"})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert Event.objects.count() == 0


@pytest.mark.django_db
def test_add_source_makes_a_stream_source_without_a_secret():
    out = StringIO()
    call_command("add_source", "clicks", "--provider", "stream", "--route", "click.*", "clicks", stdout=out)
    source = Source.objects.get(slug="clicks")
    assert (source.provider, source.secret) == ("stream", "")
    assert "consume_stream" in out.getvalue() and "Secret" not in out.getvalue()


@pytest.mark.django_db
def test_admin_adds_a_stream_source_without_a_secret(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", None))
    form = {
        "slug": "clicks",
        "provider": "stream",
        "is_active": "on",
        "routes-TOTAL_FORMS": "0",
        "routes-INITIAL_FORMS": "0",
        "routes-MIN_NUM_FORMS": "0",
        "routes-MAX_NUM_FORMS": "1000",
    }
    assert client.post("/admin/ingest/source/add/", form).status_code == 302
    assert Source.objects.get(slug="clicks").provider == "stream"
