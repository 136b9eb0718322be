"""django-tasks (the backport of Django 6's django.tasks) with its database backend: with
django-tasks 0.12 the database backend and its db_worker command live in the separate
django-tasks-db package (app django_tasks_db, backend django_tasks_db.DatabaseBackend)."""

from bench.compare.alt_settings.base import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks", "django_tasks_db"]  # noqa: F405
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
