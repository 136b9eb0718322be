"""The smallest Django project the alternatives need: their own app, auth and contenttypes, and the
database the benchmark hands over in DATABASE_URL. Kept apart from switchboard/settings.py so the
alternatives never enter the project's INSTALLED_APPS."""

from __future__ import annotations

import environ

env = environ.Env()

SECRET_KEY = env.str("SECRET_KEY", default="bench-only-alternatives-key")
DEBUG = False
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": env.db_url("DATABASE_URL")}
# Like the project: persistent connections, so no run pays a connect per job.
DATABASES["default"]["CONN_MAX_AGE"] = 60

INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
