"""A child's place in its tree (issue 30): a create naming a parent it holds the lease of takes the parent's
lineage, within the spawn caps of its tree, decided in the create's transaction before its insert."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from todos import sql
from todos.errors import ParentNotHeld, SpawnLimitReached
from todos.limits import MAX_TREE_DEPTH
from todos.metrics import SPAWN_REFUSED
from todos.models import Agent, visible_patterns
from todos.rows import fetchall


def spawn(parent: Mapping[str, str], agent: Agent, children: int) -> tuple[str, dict[str, Any]]:
    """In the create's transaction, before its insert: lock the parent if the agent holds its receipt
    (LOCK_PARENT), then decide the tree's spawn caps for ``children`` more and count them on the root
    (SPAWN_CAPS). -> the root's id, and the lineage every new row takes."""
    held = fetchall(
        sql.LOCK_PARENT,
        {"id": parent["id"], "lease_id": parent["lease_id"], "agent": agent.name, "visible": visible_patterns(agent)},
    )
    if not held:
        raise ParentNotHeld(
            f"You do not hold the current lease of todo {parent['id']}: a parent must be a todo you hold, named "
            "with its lease_id."
        )
    parent_id, root_id, depth = held[0]
    if depth > MAX_TREE_DEPTH:
        _refuse("max_depth", MAX_TREE_DEPTH)
    verdict = fetchall(sql.SPAWN_CAPS, {"root": root_id, "parent": parent_id, "depth": depth, "n": children})
    # No row: the root is gone (retention purged it, finished, while its tree lived on): no caps to apply.
    if verdict and (refused := verdict[0][0]) is not None:
        caps = dict(zip(("max_depth", "max_children", "max_descendants"), verdict[0][1:], strict=True))
        _refuse(refused, caps[refused])
    return root_id, {"parent_id": parent_id, "root_id": root_id, "depth": depth}


def _refuse(limit: str, value: int) -> None:
    SPAWN_REFUSED.labels(limit=limit).inc()
    raise SpawnLimitReached(f"The tree's {limit} is {value}: nothing was created.", limit=limit, value=value)
