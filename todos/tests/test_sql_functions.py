"""The database holds exactly the SQL functions and triggers of todos/sql/functions/, each as its file says
(issue 34: one home for each function's current text)."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from todos.sql import functions

pytestmark = pytest.mark.django_db


def _ours() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " JOIN pg_language l ON l.oid = p.prolang WHERE n.nspname = 'public' AND l.lanname = 'plpgsql'"
        )
        return dict(cursor.fetchall())


def _triggers() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal")
        return dict(cursor.fetchall())


def _body(text: str) -> str:
    match = re.search(r"\bAS \$function\$(.*?)\$function\$", text, re.DOTALL)
    assert match, "a function file holds CREATE OR REPLACE FUNCTION ... AS $function$ ... $function$"
    return match[1]


def test_every_function_of_ours_has_a_file_and_no_file_names_a_missing_one():
    assert sorted(_ours()) == functions.names()


@pytest.mark.parametrize("name", functions.names())
def test_the_database_holds_each_function_as_its_file_says(name):
    assert _ours()[name] == _body(functions.text(name))


def test_every_trigger_is_in_the_file_of_its_function_as_the_database_has_it():
    in_files = {
        match[2]: " ".join(match[1].split())
        for name in functions.names()
        for match in re.finditer(r"CREATE OR REPLACE (TRIGGER (\w+) .*?);", functions.text(name), re.DOTALL)
    }
    in_database = {
        name: " ".join(text.removeprefix("CREATE ").replace(" ON public.", " ON ").split())
        for name, text in _triggers().items()
    }
    assert in_files == in_database
