"""The no-op task django-tasks' db_worker runs."""

from django_tasks import task


@task()
def noop() -> None:
    return None
