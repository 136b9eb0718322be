"""Waits for people (issue 29): a person's decision, a reassignment, and the reaper's reminders and
escalations. Each is one statement on the todo's waitpoint row, whose lock decides every race: of two
people clicking at once exactly one closes the wait (the other re-reads it closed, decided_by set)."""

from todos import states as S
from todos.sql.common import _ERRORS_KEPT
from todos.sql.waits import _resolving

# Who may decide, as a condition on the waitpoint w: an operator (%(operator)s: staff with
# todos.change_todo, checked by Django's permissions in Python), a user the wait names, a member of a group
# it names, or once escalated, a member of an escalation group. %(groups)s: the person's group ids.
_MAY_DECIDE = """(%(operator)s::boolean OR %(user_id)s::int = ANY(w.decider_users)
          OR w.decider_groups && %(groups)s::int[]
          OR (w.escalated_at IS NOT NULL AND w.escalate_groups && %(groups)s::int[]))"""

# decide: the open people wait of this todo, the one the person saw (%(created_at)s: a newer wait of the
# same todo is another question), that allows this decision, by someone it allows; its todo still waiting
# (a cancelled todo's wait is not decided). No agent ever reaches this statement: a person decides.
# Lock: the waitpoint row (as every resolver of a wait); the loser of two concurrent decisions re-reads it
# with resolved_at set and changes nothing. Index: the waitpoint's primary key.
DECIDE = _resolving(
    f"""
    UPDATE todos_waitpoint w SET resolved_at = now(), decided_by = %(username)s
    WHERE w.todo_id = %(id)s AND w.created_at = %(created_at)s AND w.resolved_at IS NULL
      AND w.people IS NOT NULL AND w.people->'decisions' ? %(decision)s
      AND {_MAY_DECIDE}
      AND EXISTS (SELECT 1 FROM todos_todo t WHERE t.id = w.todo_id AND {S.WAITING.sql("t")})
    RETURNING w.todo_id, w.resolved_at""",
    "'person'",
    "%(detail)s::jsonb",
)

_HISTORY = f"""errors = jsonb_path_query_array(t.errors || jsonb_build_array(jsonb_build_object(
        'attempt', t.attempt, 'at', now(), 'error', %(what)s::text) || %(entry)s::jsonb), {_ERRORS_KEPT}),
        updated_at = now()"""

# reassign (an operator): who may decide an open people wait becomes these users and groups, recorded in
# the todo's history. Guard: the wait is open and for people, its todo waiting. Lock: the waitpoint row,
# then the todo's. Index: primary keys.
REASSIGN = f"""
WITH moved AS (
    UPDATE todos_waitpoint w SET decider_users = %(user_ids)s::int[], decider_groups = %(group_ids)s::int[],
        people = w.people || jsonb_build_object('users', %(users)s::jsonb, 'groups', %(groups)s::jsonb)
    WHERE w.todo_id = %(id)s AND w.resolved_at IS NULL AND w.people IS NOT NULL
      AND EXISTS (SELECT 1 FROM todos_todo t WHERE t.id = w.todo_id AND {S.WAITING.sql("t")})
    RETURNING w.todo_id, w.created_at, w.timeout_at, w.people
),
logged AS (
    UPDATE todos_todo t SET {_HISTORY}
    FROM moved WHERE t.id = moved.todo_id
)
SELECT todo_id, created_at, timeout_at, people FROM moved
"""


def _sweep(due_column: str, done_column: str) -> str:
    """remind_people / escalate_people (reaper): a batch of open people waits whose ``due_column`` has come
    and that were never reminded (escalated): set ``done_column`` (exactly once: the guard is its NULL, the
    row lock SKIP LOCKED so reapers share the batch) and record it in the todo's history. The caller sends
    the notices in the same transaction. Index: waitpoint_remind_due / waitpoint_escalate_due (their
    predicate is this WHERE, so only due, unswept, open waits are read)."""
    return f"""
WITH due AS MATERIALIZED (
    SELECT w.todo_id FROM todos_waitpoint w
    WHERE w.{due_column} IS NOT NULL AND w.{done_column} IS NULL AND w.resolved_at IS NULL
      AND w.{due_column} <= now()
    ORDER BY w.{due_column}
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
swept AS (
    UPDATE todos_waitpoint w SET {done_column} = now()
    FROM due WHERE w.todo_id = due.todo_id AND w.{done_column} IS NULL
    RETURNING w.todo_id, w.created_at, w.timeout_at, w.people, w.decider_users, w.decider_groups,
        w.escalate_groups
),
logged AS (
    UPDATE todos_todo t SET {_HISTORY}
    FROM swept WHERE t.id = swept.todo_id AND {S.WAITING.sql("t")}
    RETURNING t.id
)
SELECT s.todo_id, s.created_at, s.timeout_at, s.people, s.decider_users, s.decider_groups, s.escalate_groups
FROM swept s WHERE s.todo_id IN (SELECT id FROM logged)
"""


REMIND_PEOPLE = _sweep("remind_at", "reminded_at")
ESCALATE_PEOPLE = _sweep("escalate_at", "escalated_at")

# Expired decision links, a batch at a time (reaper), through decisionlink_expiry.
DELETE_EXPIRED_LINKS = """
DELETE FROM todos_decisionlink WHERE token_hash IN (
    SELECT token_hash FROM todos_decisionlink WHERE expires_at < now() ORDER BY expires_at LIMIT %(batch)s
)
RETURNING token_hash
"""

# spend (a signed link's first use): the link of this todo, unspent, unexpired, made for the todo's open
# wait (the wait it was made for: a later wait of the same todo does not honour it). Marks it used in the
# same statement, so of two uses (a forwarded link clicked twice, at once) exactly one gets the user.
# Index: the link's primary key (the token's hash).
SPEND_LINK = """
UPDATE todos_decisionlink l SET used_at = now()
WHERE l.token_hash = %(hash)s AND l.todo_id = %(id)s AND l.used_at IS NULL AND l.expires_at > now()
  AND EXISTS (SELECT 1 FROM todos_waitpoint w WHERE w.todo_id = l.todo_id AND w.resolved_at IS NULL
              AND w.created_at = l.wait_created_at)
RETURNING l.user_id
"""

# usable: SPEND_LINK's guard as a read (a link's GET shows its button only while the link would work).
USABLE_LINK = """
SELECT 1 FROM todos_decisionlink l
WHERE l.token_hash = %(hash)s AND l.todo_id = %(id)s AND l.used_at IS NULL AND l.expires_at > now()
  AND EXISTS (SELECT 1 FROM todos_waitpoint w WHERE w.todo_id = l.todo_id AND w.resolved_at IS NULL
              AND w.created_at = l.wait_created_at)
"""

# The open people waits one person may decide (the inbox), oldest first: through waitpoint_open_people
# (only open people waits are in it: each a question to a person, so few), filtered by who may decide,
# joined to their waiting todos for the asking agent and the queue.
INBOX = f"""
SELECT w.todo_id, w.created_at, w.timeout_at, w.people, w.reminded_at, w.escalated_at, w.waiter, t.queue,
    t.title
FROM todos_waitpoint w JOIN todos_todo t ON t.id = w.todo_id AND {S.WAITING.sql("t")}
WHERE w.people IS NOT NULL AND w.resolved_at IS NULL AND {_MAY_DECIDE}
ORDER BY w.created_at
LIMIT %(limit)s
"""
