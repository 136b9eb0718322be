"""manage.py create_agent: the agent, its scopes, and a token printed once and stored only as a hash."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from todos.models import Agent, hash_token
from todos.tests.conftest import Api


def _create(*args: str) -> str:
    out, err = StringIO(), StringIO()
    call_command("create_agent", *args, stdout=out, stderr=err)
    return out.getvalue()


@pytest.mark.django_db
def test_create_agent_prints_the_token_alone_on_the_last_line_and_stores_its_hash():
    output = _create("reviewer", "--queues", "github.*, jobs")
    token = output.strip().splitlines()[-1]
    assert token.startswith("sb_") and " " not in token
    agent = Agent.objects.get(name="reviewer")
    assert agent.token_hash == hash_token(token) and token not in agent.token_hash
    assert agent.claim_scopes == ["github.*", "jobs"] and agent.create_scopes == ["github.*", "jobs"]
    assert agent.can_retry_dead_letters is False and agent.is_active


@pytest.mark.django_db
def test_create_agent_takes_create_scopes_owner_and_retry_right(django_user_model):
    django_user_model.objects.create_user("ann")
    _create("ops", "--queues", "a", "--create-queues", "b,c", "--owner", "ann", "--can-retry")
    agent = Agent.objects.get(name="ops")
    assert agent.create_scopes == ["b", "c"] and agent.owner.username == "ann" and agent.can_retry_dead_letters


@pytest.mark.django_db
def test_create_agent_can_manage_grants_the_queue_controls():
    _create("ops", "--queues", "jobs.*", "--can-manage")
    _create("plain", "--queues", "jobs.*")
    assert Agent.objects.get(name="ops").can_manage_queues
    assert not Agent.objects.get(name="plain").can_manage_queues


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args",
    [
        ["x", "--queues", "bad scope!"],
        ["x", "--queues", ","],
        ["x", "--queues", "a", "--owner", "nobody"],
        ["bad name", "--queues", "a"],
    ],
)
def test_create_agent_with_bad_input_is_refused_and_stores_nothing(args):
    with pytest.raises(CommandError):
        _create(*args)
    assert not Agent.objects.exists()


@pytest.mark.django_db
def test_create_agent_twice_with_one_name_is_refused():
    _create("dup", "--queues", "a")
    with pytest.raises(CommandError):
        _create("dup", "--queues", "a")


@pytest.mark.django_db
def test_the_printed_token_works_on_the_api():
    token = _create("curl", "--queues", "demo").strip().splitlines()[-1]
    api = Api(token)
    assert api.post("/todos/", {"queue": "demo"}).status_code == 201
    assert len(api.post("/todos/claim/", {}).json()["todos"]) == 1
