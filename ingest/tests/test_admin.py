"""The Source admin: write-only secrets, the webhook URL, routes inline, and the pattern preview."""

from __future__ import annotations

from events.models import Event
from ingest.models import Route, Source


def _form(**overrides):
    data = {
        "slug": "gh",
        "provider": "github",
        "is_active": "on",
        "new_secret": "",
        "new_previous_secret": "",
        "routes-TOTAL_FORMS": "0",
        "routes-INITIAL_FORMS": "0",
        "routes-MIN_NUM_FORMS": "0",
        "routes-MAX_NUM_FORMS": "1000",
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def test_admin_add_source_with_a_route_stores_the_secret(admin_client):
    data = _form(
        new_secret="s3cret-value",
        **{
            "routes-TOTAL_FORMS": "1",
            "routes-0-event_pattern": "pull_request.*",
            "routes-0-queue": "github.prs",
            "routes-0-kind": "review",
            "routes-0-title_template": "{repository.full_name}",
            "routes-0-is_active": "on",
        },
    )
    response = admin_client.post("/admin/ingest/source/add/", data)
    assert response.status_code == 302, response.content[:2000]
    source = Source.objects.get()
    assert source.secret == "s3cret-value"
    assert source.routes.get().queue == "github.prs"


def test_admin_add_source_without_a_secret_is_refused(admin_client):
    response = admin_client.post("/admin/ingest/source/add/", _form())
    assert response.status_code == 200
    assert "needs its secret" in response.content.decode()
    assert Source.objects.count() == 0


def test_admin_route_with_an_invalid_queue_is_refused(admin_client):
    data = _form(
        new_secret="x",
        **{"routes-TOTAL_FORMS": "1", "routes-0-event_pattern": "*", "routes-0-queue": "no spaces allowed"},
    )
    assert admin_client.post("/admin/ingest/source/add/", data).status_code == 200
    assert Source.objects.count() == 0 and Route.objects.count() == 0


def test_admin_change_page_never_shows_the_secret_and_shows_the_webhook_url(admin_client):
    source = Source.objects.create(slug="gh", provider="github", secret="very-secret-value", previous_secret="old-one")
    page = admin_client.page(f"/admin/ingest/source/{source.pk}/change/")
    assert "very-secret-value" not in page and "old-one" not in page
    assert "http://testserver/ingest/gh/" in page


def test_admin_change_with_an_empty_secret_keeps_it(admin_client):
    source = Source.objects.create(slug="gh", provider="github", secret="keep-me")
    response = admin_client.post(f"/admin/ingest/source/{source.pk}/change/", _form(is_active=None))
    assert response.status_code == 302
    source.refresh_from_db()
    assert (source.secret, source.is_active) == ("keep-me", False)


def test_admin_rotate_keeps_the_old_secret_as_previous_until_cleared(admin_client):
    source = Source.objects.create(slug="gh", provider="github", secret="old")
    url = f"/admin/ingest/source/{source.pk}/change/"
    assert admin_client.post(url, _form(new_secret="new", rotate="on")).status_code == 302
    source.refresh_from_db()
    assert (source.secret, source.previous_secret) == ("new", "old")
    assert admin_client.post(url, _form(clear_previous_secret="on")).status_code == 302
    source.refresh_from_db()
    assert (source.secret, source.previous_secret) == ("new", "")


def test_admin_standard_source_with_a_non_base64_secret_is_refused(admin_client):
    response = admin_client.post(
        "/admin/ingest/source/add/", _form(provider="standard", new_secret="whsec_not base64!")
    )
    assert response.status_code == 200
    assert "base64" in response.content.decode()
    assert Source.objects.count() == 0


def test_admin_preview_lists_recent_events_and_which_match(admin_client):
    source = Source.objects.create(slug="gh", provider="github", secret="s")
    route = Route.objects.create(
        source=source, event_pattern="pull_request.*", queue="q", title_template="#{pull_request.number}"
    )
    Event.objects.create(
        source="gh", type="pull_request.opened", delivery_id="1", payload={"pull_request": {"number": 5}}
    )
    Event.objects.create(source="gh", type="push", delivery_id="2", payload={})
    Event.objects.create(source="other", type="pull_request.opened", delivery_id="3", payload={})
    page = admin_client.page(f"/admin/ingest/source/{source.pk}/preview/?route={route.pk}")
    assert "1 of the last 2 events match" in page
    assert "#5" in page
    page = admin_client.page(f"/admin/ingest/source/{source.pk}/preview/?pattern=*")
    assert "2 of the last 2 events match" in page


def test_admin_preview_needs_a_staff_login(client, db):
    source = Source.objects.create(slug="gh", provider="github", secret="s")
    response = client.get(f"/admin/ingest/source/{source.pk}/preview/")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
