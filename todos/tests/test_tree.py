"""Agent trees (issue 30, items 1 and 2): a todo created under a lease's receipt records its parent, root and
depth; GET /todos/<id>/tree/ and ?root= show the tree; the spawn caps of the root's queue refuse a create
past them with 409 spawn_limit, creating nothing. Over HTTP (the Django client through the whole stack)
unless the queue door itself is the subject."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse
from prometheus_client import REGISTRY

from todos import controls, queue, selectors
from todos.errors import ParentNotHeld, SpawnLimitReached
from todos.models import Agent, Queue, Todo
from todos.tests.mcp_live import mcp_base
from todos.tests.test_mcp_tools import error, ok, run

__all__ = ["mcp_base"]  # the fixture, imported for pytest

pytestmark = pytest.mark.django_db


def _held(agent: Agent, queue_name: str = "jobs", **create: Any) -> Todo:
    """A todo in ``queue_name`` that ``agent`` has claimed (it holds the receipt)."""
    todo, _ = queue.create(queue=queue_name, **create)
    return queue.claim(todo.id, agent=agent)


def _receipt(todo: Todo) -> dict[str, str]:
    return {"id": todo.id, "lease_id": str(todo.lease_id)}


def _refused(limit: str) -> float:
    return REGISTRY.get_sample_value("switchboard_spawn_refused_total", {"limit": limit}) or 0.0


def test_a_three_level_tree_over_rest_records_parent_root_and_depth(api, agent):
    root = _held(agent)
    response = api.post("/todos/", {"queue": "jobs", "title": "child", "parent": _receipt(root)})
    assert response.status_code == 201, response.json()
    child = response.json()
    assert (child["parent_id"], child["root_id"], child["depth"]) == (root.id, root.id, 1)
    claimed = queue.claim(child["id"], agent=agent)
    response = api.post("/todos/", {"queue": "jobs", "title": "grandchild", "parent": _receipt(claimed)})
    assert response.status_code == 201, response.json()
    grandchild = response.json()
    assert (grandchild["parent_id"], grandchild["root_id"], grandchild["depth"]) == (child["id"], root.id, 2)
    # A root shows itself as its root, at depth 0, and stores NULLs (a plain create writes nothing more).
    shown = api.get(f"/todos/{root.id}/").json()
    assert (shown["parent_id"], shown["root_id"], shown["depth"]) == (None, root.id, 0)
    assert Todo.objects.filter(pk=root.id, parent_id=None, root_id=None, depth=None).exists()
    # The root counts its descendants for max_descendants.
    assert Todo.objects.get(pk=root.id).descendants == 2


def test_a_batch_with_a_parent_makes_every_item_its_child(api, agent):
    root = _held(agent)
    body = {"parent": _receipt(root), "todos": [{"queue": "jobs", "kind": "a"}, {"queue": "jobs", "kind": "b"}]}
    response = api.post("/todos/batch/", body)
    assert response.status_code == 200, response.json()
    made = Todo.objects.filter(pk__in=[o["id"] for o in response.json()["outcomes"]])
    assert {(t.parent_id, t.root_id, t.depth) for t in made} == {(root.id, root.id, 1)} and len(made) == 2


def test_a_stale_or_wrong_receipt_is_409_and_creates_nothing(api, agent):
    root = _held(agent)
    wrong = api.post("/todos/", {"queue": "jobs", "parent": {"id": root.id, "lease_id": "ls_not_it"}})
    assert wrong.status_code == 409 and wrong.json()["error"]["code"] == "conflict"
    queue.complete(root.id, agent=agent, lease_id=str(root.lease_id))
    stale = api.post("/todos/", {"queue": "jobs", "parent": _receipt(root)})
    assert stale.status_code == 409, stale.json()
    batch = api.post("/todos/batch/", {"parent": _receipt(root), "todos": [{"queue": "jobs"}]})
    assert batch.status_code == 409
    assert Todo.objects.count() == 1


def test_another_agents_todo_as_parent_is_409_even_with_its_receipt(make_agent, api_for):
    alice, mallory = make_agent("alice"), make_agent("mallory")
    theirs = _held(alice)
    response = api_for(mallory).post("/todos/", {"queue": "jobs", "parent": _receipt(theirs)})
    assert response.status_code == 409
    assert "state" not in response.json()["error"]  # nothing learned about alice's todo
    assert Todo.objects.count() == 1


def test_a_parent_outside_the_creators_scopes_is_409(make_agent, api_for):
    agent = make_agent("narrowed", claim=["jobs", "other"], create=["other"])
    held = _held(agent)
    agent.claim_scopes = ["other"]  # an operator narrows its scopes while it holds the lease
    agent.save()
    response = api_for(agent).post("/todos/", {"queue": "other", "parent": _receipt(held)})
    assert response.status_code == 409
    assert Todo.objects.count() == 1


def test_a_bad_parent_is_400_naming_the_field(api):
    nul = api.post("/todos/", {"queue": "jobs", "parent": {"id": "td_\x00", "lease_id": "x"}})
    assert nul.status_code == 400 and "parent" in nul.json()["error"]["fields"]
    missing = api.post("/todos/batch/", {"parent": {"id": "td_x"}, "todos": [{"queue": "jobs"}]})
    assert missing.status_code == 400 and "parent.lease_id" in missing.json()["error"]["fields"]
    assert not Todo.objects.exists()


def test_the_system_cannot_name_a_parent(agent):
    root = _held(agent)
    with pytest.raises(Exception, match="Only an agent"):
        queue.create(queue="jobs", parent=_receipt(root))


def _tree(api: Any, todo_id: str, **params: Any) -> Any:
    return api.get(f"/todos/{todo_id}/tree/", **params)


def test_the_tree_lists_the_subtree_by_depth_with_each_nodes_state(api, agent):
    root = _held(agent, title="root")
    children = [queue.create(queue="jobs", title=f"c{n}", agent=agent, parent=_receipt(root))[0] for n in range(2)]
    first = queue.claim(children[0].id, agent=agent)
    grandchild, _ = queue.create(queue="jobs", title="g", agent=agent, parent=_receipt(first))
    response = _tree(api, root.id)
    assert response.status_code == 200, response.json()
    page = response.json()
    assert page["next"] is None and page["truncated"] is False
    nodes = page["nodes"]
    assert [(n["id"], n["parent_id"], n["depth"]) for n in nodes] == [
        (root.id, None, 0),
        *sorted((c.id, root.id, 1) for c in children),
        (grandchild.id, first.id, 2),
    ]
    assert {n["id"]: n["state"] for n in nodes}[first.id] == "claimed"
    assert set(nodes[0]) == {"id", "parent_id", "depth", "state", "dead_letter", "queue", "kind", "title"}
    # Below the root: the subtree walk.
    below = _tree(api, first.id).json()["nodes"]
    assert [(n["id"], n["depth"]) for n in below] == [(first.id, 1), (grandchild.id, 2)]
    # ?root= lists the same tree.
    listed = api.get("/todos/", root=root.id).json()["results"]
    assert {t["id"] for t in listed} == {n["id"] for n in nodes}


def test_the_tree_pages_by_cursor_and_every_node_comes_once(api, agent):
    root = _held(agent)
    made = [queue.create(queue="jobs", agent=agent, parent=_receipt(root))[0].id for _ in range(5)]
    seen: list[str] = []
    after = None
    while True:
        page = selectors.tree_page(agent, root.id, after, limit=2)
        seen += [n.id for n in page.nodes]
        if page.after is None:
            break
        after = page.after
    assert seen == [root.id, *sorted(made)]
    # Over HTTP, with a page of the real size, `next` is null; a made-up cursor is 400 naming it.
    assert _tree(api, root.id).json()["next"] is None
    bad = _tree(api, root.id, cursor="bm90LWEtY3Vyc29y")
    assert bad.status_code == 400 and "cursor" in bad.json()["error"]["fields"]


def test_nodes_outside_the_callers_scopes_are_left_out_and_a_tree_it_cannot_see_is_404(make_agent, api_for):
    alice = make_agent("alice", claim=["jobs", "secret"], create=["jobs", "secret"])
    bob = make_agent("bob", claim=["jobs"], create=["jobs"])
    root = _held(alice)
    hidden, _ = queue.create(queue="secret", agent=alice, parent=_receipt(root))
    shown, _ = queue.create(queue="jobs", agent=alice, parent=_receipt(root))
    ids = [n["id"] for n in _tree(api_for(bob), root.id).json()["nodes"]]
    assert ids == [root.id, shown.id] and hidden.id not in ids
    assert _tree(api_for(bob), hidden.id).status_code == 404
    assert _tree(api_for(bob), "td_" + "0" * 32).status_code == 404
    assert hidden.id not in {t["id"] for t in api_for(bob).get("/todos/", root=root.id).json()["results"]}


# --- spawn caps (item 2) ------------------------------------------------------------------------


def _caps(queue_name: str = "jobs", **caps: int | None) -> None:
    Queue.objects.get_or_create(name=queue_name)
    controls.set_limits(queue_name, **caps)


def test_max_depth_refuses_a_child_too_deep_with_409_spawn_limit(api, agent):
    _caps(max_depth=1)
    root = _held(agent)
    child, _ = queue.create(queue="jobs", agent=agent, parent=_receipt(root))
    held = queue.claim(child.id, agent=agent)
    before = _refused("max_depth")
    response = api.post("/todos/", {"queue": "jobs", "parent": _receipt(held)})
    assert response.status_code == 409, response.json()
    error = response.json()["error"]
    assert (error["code"], error["limit"], error["value"]) == ("spawn_limit", "max_depth", 1)
    assert Todo.objects.count() == 2
    assert _refused("max_depth") == before + 1


def test_max_children_counts_unfinished_children_only(agent):
    _caps(max_children=2)
    root = _held(agent)
    first, _ = queue.create(queue="jobs", agent=agent, parent=_receipt(root))
    queue.create(queue="jobs", agent=agent, parent=_receipt(root))
    with pytest.raises(SpawnLimitReached) as refused:
        queue.create(queue="jobs", agent=agent, parent=_receipt(root))
    assert refused.value.limit == "max_children"
    # A batch that would pass the cap is refused whole.
    queue.cancel(first.id, operator="test")
    with pytest.raises(SpawnLimitReached):
        queue.create_many([{"queue": "jobs"}, {"queue": "jobs"}], agent=agent, parent=_receipt(root))
    queue.create(queue="jobs", agent=agent, parent=_receipt(root))  # the cancelled child freed its place
    assert Todo.objects.filter(parent_id=root.id).count() == 3


def test_max_descendants_counts_a_tree_for_its_lifetime(agent):
    _caps(max_descendants=2)
    root = _held(agent)
    child, _ = queue.create(queue="jobs", agent=agent, parent=_receipt(root), idempotency_key="one")
    # The same create again finds the same todo and uses up nothing.
    again, created = queue.create(queue="jobs", agent=agent, parent=_receipt(root), idempotency_key="one")
    assert again.id == child.id and not created
    queue.cancel(child.id, operator="test")  # lifetime: a finished descendant still counts
    queue.create(queue="jobs", agent=agent, parent=_receipt(root))
    with pytest.raises(SpawnLimitReached) as refused:
        queue.create(queue="jobs", agent=agent, parent=_receipt(root))
    assert (refused.value.limit, Todo.objects.get(pk=root.id).descendants) == ("max_descendants", 2)


def _patch(api: Any, path: str, body: Any) -> Any:
    return api.client.patch("/api/v1" + path, data=json.dumps(body), content_type="application/json")


def test_the_caps_are_set_where_the_other_queue_controls_are(make_agent, api_for):
    manager = api_for(make_agent("manager", can_manage_queues=True))
    Queue.objects.create(name="jobs")
    response = _patch(manager, "/queues/jobs/", {"max_depth": 3, "max_children": 10, "max_descendants": 100})
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["max_depth"], body["max_children"], body["max_descendants"]) == (3, 10, 100)
    bad = _patch(manager, "/queues/jobs/", {"max_children": -1})
    assert bad.status_code == 400 and "max_children" in bad.json()["error"]["fields"]


def test_a_foreign_receipt_is_refused_before_any_cap(make_agent):
    _caps(max_children=0)
    alice, mallory = make_agent("alice"), make_agent("mallory")
    theirs = _held(alice)
    with pytest.raises(ParentNotHeld):
        queue.create(queue="jobs", agent=mallory, parent=_receipt(theirs))


@pytest.mark.django_db(transaction=True)
def test_mcp_create_for_takes_the_parent_and_a_batch_under_it(mcp_base, agent):
    root = _held(agent)

    async def scenario(client: Any) -> Any:
        one = ok(await client.call_tool("create_for", {"queue": "jobs", "parent": _receipt(root)}))
        many = ok(await client.call_tool("create_for", {"parent": _receipt(root), "todos": [{"queue": "jobs"}]}))
        stale = error(
            await client.call_tool("create_for", {"queue": "jobs", "parent": {"id": root.id, "lease_id": "x"}})
        )
        return one, many, stale

    one, many, stale = run(mcp_base, agent.token, scenario)
    assert (one["todo"]["parent_id"], one["todo"]["root_id"], one["todo"]["depth"]) == (root.id, root.id, 1)
    assert Todo.objects.get(pk=many["outcomes"][0]["id"]).parent_id == root.id
    assert stale["code"] == "conflict"
    assert Todo.objects.filter(parent_id=root.id).count() == 2


def _admin_page(todo_id: str) -> str:
    return reverse("admin:todos_todo_change", args=[quote(todo_id)])


def test_the_admin_todo_page_links_parent_root_and_children(admin_client, agent):
    root = _held(agent)
    child, _ = queue.create(queue="jobs", agent=agent, parent=_receipt(root))
    page = admin_client.page(_admin_page(child.id))
    assert f'parent <a href="{_admin_page(root.id)}">' in page and "depth 1" in page
    page = admin_client.page(_admin_page(root.id))
    assert "parent none (a root)" in page and f'<a href="{_admin_page(child.id)}">' in page


def test_a_cursor_past_the_deepest_tree_is_400_not_a_database_error(api, agent):
    root = _held(agent)
    deep = base64.urlsafe_b64encode(f"99999999999:{root.id}".encode()).decode().rstrip("=")
    response = _tree(api, root.id, cursor=deep)
    assert response.status_code == 400 and "cursor" in response.json()["error"]["fields"]


def test_a_roots_own_spawn_caps_tighten_its_queues_and_never_loosen_them(api, agent):
    _caps(max_children=3)
    response = api.post("/todos/", {"queue": "jobs", "spawn_caps": {"max_children": 1, "max_descendants": 5}})
    assert response.status_code == 201, response.json()
    tight = queue.claim(response.json()["id"], agent=agent)
    queue.create(queue="jobs", agent=agent, parent=_receipt(tight))
    refused = api.post("/todos/", {"queue": "jobs", "parent": _receipt(tight)})
    assert (refused.status_code, refused.json()["error"].get("limit")) == (409, "max_children")
    loose = queue.claim(queue.create(queue="jobs", spawn_caps={"max_children": 10})[0].id, agent=agent)
    for _ in range(3):
        queue.create(queue="jobs", agent=agent, parent=_receipt(loose))
    with pytest.raises(SpawnLimitReached):
        queue.create(queue="jobs", agent=agent, parent=_receipt(loose))


def test_spawn_caps_are_a_roots_and_bounded(api, agent):
    root = _held(agent)
    child = api.post("/todos/", {"queue": "jobs", "parent": _receipt(root), "spawn_caps": {"max_depth": 1}})
    assert child.status_code == 400 and "spawn_caps" in child.json()["error"]["fields"]
    for caps in ({"max_depth": -1}, {"max_kids": 1}, {"max_children": "x"}):
        bad = api.post("/todos/batch/", {"todos": [{"queue": "jobs", "spawn_caps": caps}]})
        assert bad.status_code == 400, caps
        assert any(k.startswith("todos.0.spawn_caps") for k in bad.json()["error"]["fields"]), bad.json()
    assert Todo.objects.count() == 1
