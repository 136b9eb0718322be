"""Migration 0020 (one fan-in): waits on todos open when it runs are carried over to edges, not lost."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from todos import queue
from todos.models import Dependency, Todo

_ROW = "INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors"


@pytest.mark.django_db(transaction=True)
def test_an_open_wait_on_todos_is_carried_over_to_edges_and_still_resolves():
    executor = MigrationExecutor(connection)
    # The one before 0020, whatever the chain is relinked to.
    before = [
        p.key for p in executor.loader.graph.node_map[("todos", "0020_one_fan_in")].parents if p.key[0] == "todos"
    ]
    executor.migrate(before)
    with connection.cursor() as cursor:
        cursor.execute(
            f"{_ROW}, awaited_by) VALUES ('td_kid1', 'kids', '', '', '', '{{}}', 'pending', 0, 5, '[]', '{{td_p}}')"
        )
        cursor.execute(
            f"{_ROW}, completed_at) VALUES ('td_kid2', 'kids', '', '', '', '{{}}', 'done', 0, 5, '[]', now())"
        )
        cursor.execute(
            f"{_ROW}, waiting_for, awaited_left, owner) VALUES ('td_p', 'jobs', '', '', '', '{{}}', 'waiting', 0, 5,"
            """ '[]', '{"todos": ["td_kid2", "td_kid1"]}', '{td_kid1}', 'a/w')"""
        )
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    assert list(Dependency.objects.values_list("dependency_id", "dependent_id", "wait")) == [("td_kid1", "td_p", True)]
    assert Todo.objects.get(pk="td_p").dependencies_left == 1
    assert Todo.objects.get(pk="td_kid1").has_dependents
    queue.cancel("td_kid1", operator="ops")
    parent = Todo.objects.get(pk="td_p")
    assert parent.state == "pending" and parent.resolution["todos"] == ["td_kid2", "td_kid1"]
