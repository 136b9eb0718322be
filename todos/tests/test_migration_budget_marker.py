"""Migration 0039 (issue 30, item 8): children created before the claim's budget marker existed are marked when
their root has a budget, and only then (todos/sql/trees.py, BUDGET_OPEN)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from todos.models import Todo

_ROW = "INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts, errors"


@pytest.mark.django_db(transaction=True)
def test_the_children_of_budgeted_roots_are_marked_and_no_others():
    executor = MigrationExecutor(connection)
    # The one before 0039, whatever the chain is relinked to.
    before = [
        p.key
        for p in executor.loader.graph.node_map[("todos", "0039_mark_budgeted_trees")].parents
        if p.key[0] == "todos"
    ]
    executor.migrate(before)
    with connection.cursor() as cursor:
        cursor.execute(
            f"{_ROW}, budget) VALUES ('td_rb', 'jobs', '', '', '', '{{}}', 'pending', 0, 5, '[]', %s)",
            ['{"tokens": 5}'],
        )
        cursor.execute(f"{_ROW}) VALUES ('td_rp', 'jobs', '', '', '', '{{}}', 'pending', 0, 5, '[]')")
        for child, root in (("td_b1", "td_rb"), ("td_b2", "td_rb"), ("td_p1", "td_rp")):
            cursor.execute(
                f"{_ROW}, parent_id, root_id, depth) VALUES (%s, 'jobs', '', '', '', '{{}}', 'pending', 0, 5, '[]',"
                " %s, %s, 1)",
                [child, root, root],
            )
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    marks = dict(Todo.objects.values_list("id", "budget_exhausted"))
    assert marks == {"td_rb": None, "td_rp": None, "td_b1": False, "td_b2": False, "td_p1": None}
