"""Procrastinate through its Django integration (procrastinate.contrib.django)."""

from bench.compare.alt_settings.base import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "procrastinate.contrib.django"]  # noqa: F405
PROCRASTINATE_IMPORT_PATHS = ["bench.compare.alt_settings.procrastinate_tasks"]
