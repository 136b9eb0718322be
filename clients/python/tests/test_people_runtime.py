"""The worker runtime asks a person (issue 29): a handler raises ``Wait(people=...)``, a person edits the
proposed arguments, and the handler runs again with the structured resolution; ``Client.wait(people=...)``
answers the waiting todo."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from django.contrib.auth.models import User
from switchboard_client import Client, Wait, Worker
from switchboard_client.errors import Invalid

from todos import queue
from todos.models import Todo, TodoState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ASK = {
    "users": ["dana"],
    "title": "Send this email?",
    "body": "To **ada@example.com**.",
    "decisions": ["approve", "reject", "edit"],
    "edit_schema": {"type": "object", "properties": {"subject": {"type": "string", "maxLength": 100}}},
    "arguments": {"subject": "Hello"},
}


def wait_until(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_handler_asks_a_person_and_runs_again_with_the_edited_arguments(server, agent):
    dana = User.objects.create_user("dana", "dana@example.com", "pw-dana-123")
    todo = queue.create(queue="mail", kind="send")[0]
    client = Client(server.base, agent.token)
    worker = Worker(client, queues=["mail"], poll_seconds=1)
    waiting = []

    @worker.handler("send")
    def handle(todo):
        if todo.resolution is None:
            raise Wait(people=ASK, timeout_seconds=3600, on_waiting=waiting.append)
        return {"sent_subject": (todo.resolution["edited"] or {}).get("subject"), "by": todo.resolution["decided_by"]}

    thread = threading.Thread(target=lambda: asyncio.run(worker.arun()), daemon=True)
    thread.start()
    try:
        wait_until(lambda: bool(waiting))
        assert waiting[0].state == "waiting" and waiting[0].waiting_for["people"]["users"] == ["dana"]
        queue.decide(todo.pk, user=dana, decision="edit", edited={"subject": "Hello Ada"})
        wait_until(lambda: Todo.objects.filter(pk=todo.pk, state=TodoState.DONE).exists())
    finally:
        worker.stop()
        thread.join(20)
        client.close()
    todo.refresh_from_db()
    assert todo.result == {"sent_subject": "Hello Ada", "by": "dana"}
    assert todo.resolution["by"] == "person" and todo.resolution["decision"] == "edit"


def test_client_wait_with_people_and_a_bad_name_is_a_400_naming_it(server, agent):
    User.objects.create_user("dana", "dana@example.com", "pw-dana-123")
    todo = queue.create(queue="mail", kind="send")[0]
    with Client(server.base, agent.token) as client:
        claimed = client.claim_one(todo.pk)
        with pytest.raises(Invalid) as refused:
            client.wait(claimed, people={**ASK, "users": ["nobody"]}, timeout_seconds=60)
        assert list(refused.value.fields) == ["for.people.users"]
        waiting = client.wait(claimed, people=ASK, timeout_seconds=60)
        assert waiting.state == "waiting"
