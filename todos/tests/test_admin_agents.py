"""The agent admin: the token is shown once and never stored; revoke; rotate; scopes editable."""

from __future__ import annotations

from django.contrib.admin.models import LogEntry
from django.contrib.sessions.models import Session
from django.db import connection
from django.urls import reverse

from todos.models import Agent, hash_token


def _token_from(body: str) -> str:
    start = body.index('<code class="sb-token">') + len('<code class="sb-token">')
    return body[start : body.index("</code>", start)]


def _database_contains(text: str) -> bool:
    """Whether ``text`` appears in any column of any row of the tables an admin request writes."""
    with connection.cursor() as cursor:
        for table in ("todos_agent", "django_admin_log", "django_session"):
            cursor.execute(f"SELECT count(*) FROM {table} t WHERE t::text LIKE %s", [f"%{text}%"])
            if cursor.fetchone()[0]:
                return True
    return False


def test_add_agent_shows_the_token_once_and_stores_only_its_hash(admin_client, admin_user):
    response = admin_client.post(
        reverse("admin:todos_agent_add"),
        {
            "name": "builder",
            "owner": admin_user.pk,
            "claim_scopes": "github.*,ci",
            "create_scopes": "ci",
            "is_active": "on",
        },
    )
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    body = response.content.decode()
    token = _token_from(body)
    assert token.startswith("sb_") and "shown only once" in body
    agent = Agent.objects.get(name="builder")
    assert agent.token_hash == hash_token(token)
    assert agent.claim_scopes == ["github.*", "ci"] and agent.owner == admin_user
    assert not _database_contains(token)
    assert Session.objects.exists()  # the session was checked, not absent
    # The change page never shows it again.
    page = admin_client.page(reverse("admin:todos_agent_change", args=[agent.pk]))
    assert token not in page and agent.token_prefix in page


def test_revoke_deactivates_and_logs(admin_client, make_agent):
    agent = make_agent("old")
    admin_client.post(reverse("admin:todos_agent_changelist"), {"action": "revoke", "_selected_action": [agent.pk]})
    agent.refresh_from_db()
    assert not agent.is_active
    assert LogEntry.objects.filter(object_id=str(agent.pk), change_message="Revoked (deactivated)").exists()


def test_rotate_token_shows_a_new_token_and_voids_the_old(admin_client, make_agent):
    agent = make_agent("rotor")
    old = agent.token
    response = admin_client.post(
        reverse("admin:todos_agent_changelist"), {"action": "rotate_token", "_selected_action": [agent.pk]}
    )
    new = _token_from(response.content.decode())
    agent.refresh_from_db()
    assert new != old and agent.token_hash == hash_token(new)
    assert not Agent.objects.filter(token_hash=hash_token(old)).exists()
    assert not _database_contains(new)


def test_scopes_are_editable_and_the_name_is_not(admin_client, make_agent):
    agent = make_agent("scoped", claim=["a"])
    response = admin_client.post(
        reverse("admin:todos_agent_change", args=[agent.pk]),
        {"name": "renamed", "claim_scopes": "a,b.*", "create_scopes": "b.*", "is_active": "on"},
    )
    assert response.status_code == 302
    agent.refresh_from_db()
    assert agent.name == "scoped" and agent.claim_scopes == ["a", "b.*"] and agent.create_scopes == ["b.*"]


def test_bad_scope_is_refused(admin_client, make_agent):
    agent = make_agent("strict", claim=["a"])
    response = admin_client.post(
        reverse("admin:todos_agent_change", args=[agent.pk]),
        {"claim_scopes": "a,bad scope!", "create_scopes": "a", "is_active": "on"},
    )
    assert response.status_code == 200 and b"errorlist" in response.content
    agent.refresh_from_db()
    assert agent.claim_scopes == ["a"]
