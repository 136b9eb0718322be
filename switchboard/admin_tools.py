"""Pieces the admin's big-table pages share: a paginator that never counts a whole table, and a cheap
DISTINCT for filter choices."""

from __future__ import annotations

from functools import cached_property
from typing import Any, cast

from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import QuerySet
from django.http import HttpRequest


class EstimatedCountPaginator(Paginator[Any]):
    """Counts without COUNT(*) over millions of rows.

    Unfiltered, the count is PostgreSQL's estimate (pg_class.reltuples, kept by autovacuum/ANALYZE).
    Filtered, it counts at most ``cap + 1`` matching rows (a LIMIT inside the COUNT), so a page load
    costs at most a short index walk; past the cap the page says "more than" and pages stop there.
    """

    cap = 10_000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.count_is_estimate = False
        self.count_is_capped = False

    @cached_property
    def count(self) -> int:
        # The admin's changelists page querysets only (the paginator is theirs, not a general one).
        qs = cast("QuerySet[Any]", self.object_list)
        if not qs.query.where:
            estimate = table_estimate(qs.model._meta.db_table)
            if estimate > self.cap:
                self.count_is_estimate = True
                return estimate
        n = qs.order_by()[: self.cap + 1].count()
        if n > self.cap:
            self.count_is_capped = True
            return self.cap
        return n


def staff_user_id(request: HttpRequest) -> int:
    """The id of the user behind an admin request, for the admin log. admin_view lets only logged-in
    staff reach an admin page, so an anonymous user here is a wiring mistake: refuse, never log as None."""
    if request.user.pk is None:
        raise PermissionDenied
    return int(request.user.pk)


def table_estimate(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [table])
        row = cursor.fetchone()
    # reltuples is -1 until the table is first vacuumed or analysed.
    return max(int(row[0]), 0) if row else 0


def distinct_values(table: str, column: str, *, limit: int = 100) -> list[str]:
    """The distinct non-empty values of an indexed column by a skip scan: one index descent per
    value (a recursive CTE), instead of reading every row as SELECT DISTINCT would.

    ``table`` and ``column`` come from code, never from a request.
    """
    statement = f"""
    WITH RECURSIVE v(val) AS (
        (SELECT {column} FROM {table} WHERE {column} > '' ORDER BY {column} LIMIT 1)
        UNION ALL
        SELECT (SELECT {column} FROM {table} WHERE {column} > v.val ORDER BY {column} LIMIT 1)
        FROM v WHERE v.val IS NOT NULL
    )
    SELECT val FROM v WHERE val IS NOT NULL LIMIT %s
    """
    with connection.cursor() as cursor:
        cursor.execute(statement, [limit])
        return [row[0] for row in cursor.fetchall()]
