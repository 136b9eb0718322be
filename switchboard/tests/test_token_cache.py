"""The optional per-process cache of token -> agent (API_TOKEN_CACHE_SECONDS)."""

from __future__ import annotations

import pytest

from todos.auth import token_cache
from todos.longpoll import listener
from todos.models import Agent
from todos.tests.conftest import Api


@pytest.fixture
def cached(settings):
    settings.API_TOKEN_CACHE_SECONDS = 60
    listener._ensure_running()
    assert listener.connected.wait(5)
    token_cache.clear()
    yield
    token_cache.clear()


def test_a_cached_token_needs_no_query(cached, agent, django_assert_num_queries):
    client = Api(agent.token)
    assert client.get("/queues/").status_code == 200
    with django_assert_num_queries(1):  # the queue counts only
        assert client.get("/queues/").status_code == 200


def test_deactivating_an_agent_in_this_process_takes_effect_at_once(cached, agent):
    client = Api(agent.token)
    assert client.get("/queues/").status_code == 200
    agent.is_active = False
    agent.save()
    assert client.get("/queues/").status_code == 401


def test_a_change_made_elsewhere_is_seen_after_the_ttl(cached, agent, settings):
    client = Api(agent.token)
    assert client.get("/queues/").status_code == 200
    Agent.objects.filter(pk=agent.pk).update(is_active=False)  # as another process would: no signal here
    assert client.get("/queues/").status_code == 200
    token_cache._entries[agent.token_hash] = (0.0, token_cache._entries[agent.token_hash][1])  # the TTL ran out
    assert client.get("/queues/").status_code == 401


def test_unknown_tokens_are_never_cached(cached, db):
    assert Api("sb_unknown").get("/queues/").status_code == 401
    assert token_cache._entries == {}


def test_off_when_set_to_zero(agent, settings, django_assert_num_queries):
    settings.API_TOKEN_CACHE_SECONDS = 0
    client = Api(agent.token)
    client.get("/queues/")
    with django_assert_num_queries(2):
        client.get("/queues/")
