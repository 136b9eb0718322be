"""Issue 29 under issue 28's threat model: outbound requests (people's webhooks, todos' callbacks) cannot be
aimed at the inside (SSRF), and the system queue of deliveries is out of every agent's reach. Each test
attacks as a compromised agent token (or a careless operator's endpoint) would, with
OUTBOUND_ALLOW_PRIVATE_NETWORKS off as in production."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connection

from todos.models import Agent, NotifyEndpoint, Todo, scope_like_patterns, scope_matches
from todos.notices import NOTIFY_QUEUE, Notice, notify_url, notify_users
from todos.tests.outbound_receivers import make_ca_and_cert, running_receiver

NOTICE = Notice(key="k", event="wait.asked", subject="s", text="t")

INSIDE = [
    "http://127.0.0.1/",
    "http://127.1:8000/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.7/",
    "http://192.168.1.1/",
    "http://0.0.0.0/",
    "http://localhost:8000/admin/",
    "file:///etc/passwd",
    "ftp://example.com/x",
    "gopher://127.0.0.1:25/",
    "http:///nohost",
]


@pytest.fixture
def production(settings):
    settings.OUTBOUND_ALLOW_PRIVATE_NETWORKS = False
    return settings


def run_notify() -> str:
    out = StringIO()
    call_command("notify", "--once", stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("url", INSIDE)
def test_a_callback_to_the_inside_is_refused_at_create_naming_the_field(production, api, url):
    response = api.post("/todos/", {"queue": "jobs", "callback": {"url": url}})
    assert response.status_code == 400, response.content
    assert "callback.url" in json.dumps(response.json())
    assert not Todo.objects.exists()


@pytest.mark.parametrize("url", INSIDE[:4] + INSIDE[8:10])
def test_an_endpoint_to_the_inside_is_refused_on_save(production, db, url):
    ann = User.objects.create_user("ann")
    with pytest.raises(ValidationError) as refused:
        NotifyEndpoint(user=ann, url=url).full_clean()
    assert "url" in refused.value.message_dict


def test_an_endpoint_that_turned_private_is_refused_at_send_and_nothing_is_sent(settings, db):
    # Saved while allowed (or its name re-pointed at the inside since): the sender checks again.
    with running_receiver() as inside:
        ann = User.objects.create_user("ann")
        NotifyEndpoint.objects.create(user=ann, url=inside.url)
        [delivery] = notify_users(users=[ann], notice=NOTICE)
        settings.OUTBOUND_ALLOW_PRIVATE_NETWORKS = False
        assert run_notify() == "sent=0 failed=1\n"
        assert inside.requests == []
    assert "refused" in Todo.objects.get(id=delivery).errors[-1]["error"]


def test_a_redirect_to_the_inside_is_refused_on_that_hop(production, db):
    # The first hop is allowed explicitly (an operator's internal bridge); its 302 to another loopback
    # address is checked again, refused, and that address gets nothing.
    with running_receiver() as bridge, running_receiver() as inside:
        production.OUTBOUND_ALLOW_HOSTS = [bridge.url.removeprefix("http://")]
        bridge.location = inside.url + "/steal"
        delivery = notify_url(url=bridge.url + "/hook", secret="whsec_c2VjcmV0", notice=NOTICE)
        assert run_notify() == "sent=0 failed=1\n"
        assert len(bridge.requests) == 1 and inside.requests == []
    error = Todo.objects.get(id=delivery).errors[-1]["error"]
    assert error.startswith("refused (redirect 1): " + inside.url + "/steal")


@pytest.mark.parametrize("location", ["file:///etc/passwd", "http://169.254.169.254/latest/meta-data/"])
def test_a_redirect_to_another_scheme_or_the_metadata_service_is_refused(production, db, location):
    with running_receiver() as bridge:
        production.OUTBOUND_ALLOW_HOSTS = [bridge.url.removeprefix("http://")]
        bridge.location = location
        delivery = notify_url(url=bridge.url, secret="whsec_c2VjcmV0", notice=NOTICE)
        assert run_notify() == "sent=0 failed=1\n"
    assert "refused (redirect 1)" in Todo.objects.get(id=delivery).errors[-1]["error"]


def test_the_connection_goes_to_the_vetted_address_with_the_name_as_host(db):
    # No second resolution: the request is made to the address the guard checked, the name in Host.
    with running_receiver() as recv:
        port = recv.url.rsplit(":", 1)[1]
        notify_url(url=f"http://localhost:{port}/x", secret="whsec_c2VjcmV0", notice=NOTICE)
        assert run_notify() == "sent=1 failed=0\n"
        assert recv.requests[0].headers["host"] == f"localhost:{port}"


# --- the system queue ------------------------------------------------------------------------------


def test_an_agent_cannot_create_in_the_system_queue(api):
    response = api.post("/todos/", {"queue": NOTIFY_QUEUE, "title": "spoofed notice"})
    assert response.status_code == 400 and "queue" in json.dumps(response.json())
    batch = api.post("/todos/batch/", {"todos": [{"queue": NOTIFY_QUEUE}]})
    assert batch.status_code == 400
    assert not Todo.objects.filter(queue=NOTIFY_QUEUE).exists()


@pytest.mark.parametrize("scope", ["*", "?switchboard.notify", "*notify", "*_switchboard.notify", "**", "?*"])
def test_no_wildcard_scope_reaches_the_system_queue(make_agent, api_for, scope):
    thief = make_agent("thief", claim=[scope, "jobs"], create=[scope, "jobs"])
    api = api_for(thief)
    delivery = notify_url(url="https://example.com/hook", secret="whsec_c2VjcmV0", notice=NOTICE)
    claimed = api.post("/todos/claim/", {"limit": 10})
    assert claimed.status_code == 200 and claimed.json()["todos"] == []
    assert api.post("/todos/claim/", {"queues": [NOTIFY_QUEUE]}).json().get("todos", []) == []
    assert api.post(f"/todos/{delivery}/claim/").status_code == 404
    assert api.get(f"/todos/{delivery}/").status_code == 404
    assert all(t["id"] != delivery for t in api.get("/todos/").json()["results"])
    assert api.post(f"/todos/{delivery}/cancel/").status_code in (403, 404)
    assert Todo.objects.get(id=delivery).state == "pending"


def test_only_a_scope_naming_the_system_queue_reaches_it():
    assert scope_matches(["_switchboard.notify"], NOTIFY_QUEUE)
    assert scope_matches(["_switchboard.*"], NOTIFY_QUEUE)
    assert not scope_matches(["*", "?switchboard.notify", "*notify"], NOTIFY_QUEUE)
    assert Agent(claim_scopes=["*"]).may_claim_from("jobs") and not Agent(claim_scopes=["*"]).may_claim_from(
        NOTIFY_QUEUE
    )


NAMES = ["jobs", "a", "a_b", "github.prs", "9x", "Z", NOTIFY_QUEUE, "_other", "x_switchboard.notify"]
SCOPES = ["*", "?", "??", "*_*", "*.*", "?_*", "a*", "*s", "*notify", "_*", "_switchboard.notify", "j?bs", "*?*"]


@pytest.mark.django_db
@pytest.mark.parametrize("scope", SCOPES)
def test_the_sql_patterns_and_the_python_matcher_agree(scope):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n FROM unnest(%s::text[]) AS n WHERE n LIKE ANY(%s::text[]) ORDER BY n",
            [NAMES, scope_like_patterns(scope)],
        )
        in_sql = [row[0] for row in cursor.fetchall()]
    assert in_sql == sorted(n for n in NAMES if scope_matches([scope], n))
    assert (NOTIFY_QUEUE in in_sql) == scope.startswith("_")


def test_https_to_the_vetted_address_checks_the_certificate_against_the_name(db, settings, tmp_path):
    # Connected by IP, the name goes as SNI and the certificate must be the name's: pinning the address
    # does not switch verification off.
    ca_file, tls = make_ca_and_cert(tmp_path, "localhost")
    settings.OUTBOUND_CA_BUNDLE = ca_file
    with running_receiver(tls) as recv:
        good = notify_url(url=f"https://localhost:{recv.port}/x", secret="whsec_c2VjcmV0", notice=NOTICE)
        assert run_notify() == "sent=1 failed=0\n"
        assert recv.requests[0].headers["host"] == f"localhost:{recv.port}"
        # The same server by its address: the certificate names localhost, not 127.0.0.1.
        bad = notify_url(url=f"https://127.0.0.1:{recv.port}/x", secret="whsec_c2VjcmV0", notice=NOTICE)
        assert run_notify() == "sent=0 failed=1\n"
    assert Todo.objects.get(id=good).state == "done"
    assert "CERTIFICATE_VERIFY_FAILED" in Todo.objects.get(id=bad).errors[-1]["error"]


def test_https_with_an_unknown_ca_is_refused(db, tmp_path):
    _, tls = make_ca_and_cert(tmp_path, "localhost")
    with running_receiver(tls) as recv:
        bad = notify_url(url=f"https://localhost:{recv.port}/x", secret="whsec_c2VjcmV0", notice=NOTICE)
        assert run_notify() == "sent=0 failed=1\n"
        assert recv.requests == []
    assert "CERTIFICATE_VERIFY_FAILED" in Todo.objects.get(id=bad).errors[-1]["error"]
