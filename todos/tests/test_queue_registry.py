"""The queue registry is kept by the database (migration 0009's trigger): a todo written into a new
queue by any path, not only queue.create, is claimable, because the claim scan expands scope globs
against todos_queue."""

from __future__ import annotations

from django.db import connection
from django.db.migrations.loader import MigrationLoader

from todos import queue
from todos.models import Queue, Todo


def _claimed_ids(agent) -> set[str]:
    return {t.id for t in queue.claim_next(agent=agent, limit=10)}


def test_a_todo_created_through_the_orm_in_a_new_queue_is_claimable(agent):
    todo = Todo.objects.create(queue="orm.new", title="from the ORM")
    assert Queue.objects.filter(name="orm.new").exists()
    assert _claimed_ids(agent) == {todo.id}


def test_todos_bulk_created_through_the_orm_are_claimable(agent):
    todos = Todo.objects.bulk_create([Todo(queue=f"bulk.{i}", title="bulk") for i in range(3)])
    assert _claimed_ids(agent) == {t.id for t in todos}


def test_a_todo_inserted_with_raw_sql_in_a_new_queue_is_claimable(agent):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO todos_todo (id, queue, source, kind, title, payload, state, attempt, max_attempts,"
            " errors, created_at, updated_at) VALUES ('td_raw', 'raw.new', '', '', 'raw', '{}', 'pending', 0, 5,"
            " '[]', now(), now())"
        )
    assert _claimed_ids(agent) == {"td_raw"}


def test_a_todo_written_by_a_data_migration_in_a_new_queue_is_claimable(agent):
    # A data migration sees the historical model (apps.get_model), not todos.models.Todo.
    historical = MigrationLoader(connection).project_state().apps.get_model("todos", "Todo")
    historical.objects.create(id="td_migrated", queue="migrated.new", title="from a data migration")
    assert _claimed_ids(agent) == {"td_migrated"}


def test_moving_a_todo_to_a_new_queue_registers_that_queue(agent):
    todo = Todo.objects.create(queue="old.queue", title="moved")
    Todo.objects.filter(pk=todo.pk).update(queue="moved.here")
    assert Queue.objects.filter(name="moved.here").exists()
    assert [t.queue for t in queue.claim_next(agent=agent, queues=["moved.*"])] == ["moved.here"]


def test_creating_in_a_known_queue_adds_no_registry_row(agent):
    queue.create(queue="known")
    queue.create(queue="known")
    Todo.objects.create(queue="known")
    assert Queue.objects.filter(name="known").count() == 1


def test_one_insert_of_many_todos_registers_each_new_queue_once(agent):
    outcomes = queue.create_many([{"queue": f"batch.{i % 3}"} for i in range(30)] + [{"queue": "known"}])
    assert len(outcomes) == 31
    assert sorted(Queue.objects.values_list("name", flat=True)) == ["batch.0", "batch.1", "batch.2", "known"]
    assert len(_claimed_ids(agent)) == 10
