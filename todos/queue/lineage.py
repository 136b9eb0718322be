"""A child's place in its tree (issue 30): a create naming a parent it holds the lease of takes the parent's
lineage, within the spawn caps of its tree, decided in the create's own INSERT statement (todos/sql/create.py,
SPAWN): the receipt, the caps and the insert are one statement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from todos import sql
from todos.errors import ParentNotHeld, SpawnLimitReached
from todos.limits import MAX_TREE_DEPTH
from todos.metrics import SPAWN_REFUSED
from todos.models import Agent, visible_patterns
from todos.rows import fetchall


class Stale(Exception):
    """SPAWN's max_children count read a snapshot older than the root's lock (a create of the same tree
    committed in between): nothing was written; run it again after lock_root, in a transaction."""


def spawning(parent: Mapping[str, str], agent: Agent, children: int) -> dict[str, Any]:
    """SPAWN's parameters beside the items: the parent's receipt, the caller's scopes and how many children."""
    return {
        "id": parent["id"],
        "lease_id": parent["lease_id"],
        "agent": agent.name,
        "visible": visible_patterns(agent),
        "n": children,
        "max_tree_depth": MAX_TREE_DEPTH,
    }


def lock_root(params: Mapping[str, Any]) -> None:
    """In the create's transaction, before SPAWN: the tree's root, locked (sql.LOCK_ROOT), so that SPAWN's
    snapshot is taken with it held."""
    fetchall(sql.LOCK_ROOT, {"id": params["id"], "lease_id": params["lease_id"]})


def inserted(rows: Sequence[tuple[Any, ...]], parent_id: str) -> list[tuple[Any, ...]]:
    """SPAWN's answer -> the rows it inserted (their columns, the verdict's cut off): [] when every item's key
    was held. Raises ParentNotHeld (no row), SpawnLimitReached naming the cap refused, or Stale."""
    if not rows:
        raise ParentNotHeld(
            f"You do not hold the current lease of todo {parent_id}: a parent must be a todo you hold, named "
            "with its lease_id."
        )
    refused, value = rows[0][0], rows[0][1]
    if refused == "stale":
        raise Stale
    if refused is not None:
        SPAWN_REFUSED.labels(limit=refused).inc()
        raise SpawnLimitReached(f"The tree's {refused} is {value}: nothing was created.", limit=refused, value=value)
    return [row[2:] for row in rows if row[2] is not None]
