-- Whether a todo is reserved (has a todos_fairready row: a contended fair turn already charged it to its key's
-- pass; todos/sql/claim.py, CLAIM_FAIR_READY), read with a fresh snapshot (VOLATILE, plpgsql so it is never
-- inlined into the caller's snapshot): the fair claim's scan of a key's todos (fair_pending) runs after waiting
-- for the queue's row, and its own snapshot does not show the reservations its predecessor committed. One probe
-- of the primary key.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_fair_reserved(todo_id text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN EXISTS (SELECT 1 FROM todos_fairready r WHERE r.id = todo_id);
END
$function$;
