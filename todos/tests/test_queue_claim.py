from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models.functions import Now

from todos import queue
from todos.errors import QueuesForbidden, TodoConflict, TodoNotFound
from todos.models import TodoState


def test_claim_next_takes_the_oldest_pending_todo(agent, make_todo):
    old = make_todo("q", created_at=Now() - timedelta(minutes=5))
    make_todo("q")
    [todo] = queue.claim_next(agent=agent, queues=["q"])
    assert todo.id == old.id
    old.refresh_from_db()
    assert old.state == TodoState.CLAIMED
    assert old.attempt == 1
    assert old.owner == "alice"
    assert old.lease_id and old.lease_id.startswith("ls_")
    assert old.claimed_at is not None
    assert old.lease_expires_at > old.claimed_at


def test_claim_next_returns_nothing_when_nothing_is_claimable(agent, make_todo):
    make_todo("q", state=TodoState.DONE)
    assert queue.claim_next(agent=agent) == []


def test_claim_next_is_oldest_first_across_several_queues(agent, make_todo):
    a = make_todo("a", created_at=Now() - timedelta(minutes=3))
    b = make_todo("b", created_at=Now() - timedelta(minutes=5))
    c = make_todo("c", created_at=Now() - timedelta(minutes=1))
    got = queue.claim_next(agent=agent, limit=3)
    assert [t.id for t in got] == [b.id, a.id, c.id]


def test_claim_next_batch_takes_at_most_limit(agent, make_todo):
    for _ in range(5):
        make_todo("q")
    assert len(queue.claim_next(agent=agent, limit=3)) == 3
    assert len(queue.claim_next(agent=agent, limit=3)) == 2


def test_claim_next_gives_each_todo_its_own_lease_id(agent, make_todo):
    make_todo("q")
    make_todo("q")
    got = queue.claim_next(agent=agent, limit=2)
    assert len({t.lease_id for t in got}) == 2


def test_claim_next_only_sees_queues_in_the_agents_claim_scopes(make_agent, make_todo):
    bot = make_agent("bot", claim=["github.*"])
    make_todo("stripe.charges")
    mine = make_todo("github.push")
    got = queue.claim_next(agent=bot, limit=10)
    assert [t.id for t in got] == [mine.id]


def test_claim_next_queues_narrow_but_never_widen_the_scopes(make_agent, make_todo):
    bot = make_agent("bot", claim=["github.*"])
    make_todo("stripe.charges")
    make_todo("github.push")
    prs = make_todo("github.prs")
    with pytest.raises(QueuesForbidden) as refused:
        queue.claim_next(agent=bot, queues=["stripe.charges", "github.*"])
    assert refused.value.extra == {"queues": ["stripe.charges"]}
    assert [t.id for t in queue.claim_next(agent=bot, queues=["github.prs"])] == [prs.id]


def test_claim_next_skips_todos_assigned_to_someone_else(make_agent, make_todo):
    alice, bob = make_agent("alice"), make_agent("bob")
    make_todo("q", assignee="bob")
    assert queue.claim_next(agent=alice) == []
    assert len(queue.claim_next(agent=bob)) == 1


def test_claim_next_takes_a_lapsed_lease_before_any_reaper_runs(make_agent, make_todo):
    alice, bob = make_agent("alice"), make_agent("bob")
    make_todo("q")
    [first] = queue.claim_next(agent=alice)
    from todos.models import Todo

    Todo.objects.filter(pk=first.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
    [again] = queue.claim_next(agent=bob)
    assert again.id == first.id
    assert again.owner == "bob"
    assert again.attempt == 2
    assert again.lease_id != first.lease_id
    assert again.errors[-1]["error"] == "lease expired" and again.errors[-1]["attempt"] == 1


def test_claim_next_never_hands_out_a_lapsed_lease_at_its_cap(agent, make_todo):
    make_todo(
        "q",
        state=TodoState.CLAIMED,
        attempt=5,
        max_attempts=5,
        owner="x",
        lease_id="ls_old",
        lease_expires_at=Now() - timedelta(seconds=1),
    )
    assert queue.claim_next(agent=agent) == []


def test_claim_next_takes_a_failed_todo_whose_retry_is_due(agent, make_todo):
    due = make_todo("q", state=TodoState.FAILED, attempt=1, next_retry_at=Now() - timedelta(seconds=1))
    make_todo("q", state=TodoState.FAILED, attempt=1, next_retry_at=Now() + timedelta(hours=1))
    got = queue.claim_next(agent=agent, limit=5)
    assert [t.id for t in got] == [due.id]
    assert got[0].attempt == 2 and got[0].next_retry_at is None


def test_claim_next_never_takes_a_dead_letter(agent, make_todo):
    make_todo("q", state=TodoState.FAILED, attempt=5, next_retry_at=None)
    assert queue.claim_next(agent=agent) == []


def test_claim_next_records_the_worker_label_in_the_owner(agent, make_todo):
    make_todo("q")
    [todo] = queue.claim_next(agent=agent, worker="host-1")
    assert todo.owner == "alice/host-1"


def test_claim_next_uses_the_requested_lease(agent, make_todo):
    make_todo("q")
    [todo] = queue.claim_next(agent=agent, lease_seconds=30)
    assert timedelta(seconds=29) < todo.lease_expires_at - todo.claimed_at <= timedelta(seconds=30)


def test_claim_one_claims_that_todo(agent, make_todo):
    make_todo("q", created_at=Now() - timedelta(minutes=1))
    target = make_todo("q")
    todo = queue.claim(target.id, agent=agent)
    assert todo.id == target.id and todo.state == TodoState.CLAIMED


def test_claim_one_of_a_claimed_todo_is_conflict(make_agent, make_todo):
    alice, bob = make_agent("alice"), make_agent("bob")
    target = make_todo("q")
    queue.claim(target.id, agent=alice)
    with pytest.raises(TodoConflict) as err:
        queue.claim(target.id, agent=bob)
    assert err.value.state == "claimed"


def test_claim_one_outside_the_scopes_is_not_found(make_agent, make_todo):
    bot = make_agent("bot", claim=["github.*"])
    target = make_todo("stripe.x")
    with pytest.raises(TodoNotFound):
        queue.claim(target.id, agent=bot)


def test_claim_one_of_an_absent_todo_is_not_found(agent):
    with pytest.raises(TodoNotFound):
        queue.claim("td_nope", agent=agent)


def test_claim_one_assigned_to_another_is_conflict(make_agent, make_todo):
    alice = make_agent("alice")
    make_agent("bob")
    target = make_todo("q", assignee="bob")
    with pytest.raises(TodoConflict):
        queue.claim(target.id, agent=alice)
