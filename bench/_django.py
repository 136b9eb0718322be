"""Set up Django for a bench script against a scratch database, never the development one.

Without DATABASE_URL the embedded server is used with a database of the script's own name (created on
first use). With DATABASE_URL, the database's name must say it is disposable (contain "bench" or
"scratch"): the scripts truncate the todos table.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def setup(database: str) -> None:
    sys.path.insert(0, str(BASE_DIR))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only-not-a-secret")
    os.environ.setdefault("EMBEDDED_PG_DATABASE", database)
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.db import connection

    name = connection.settings_dict["NAME"]
    if "bench" not in name and "scratch" not in name:
        sys.exit(f"refusing to seed database {name!r}: its name must contain 'bench' or 'scratch'")


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
