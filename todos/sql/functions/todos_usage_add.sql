-- Budgets (issue 30): the counters `a` plus `b` ({name: number}), name by name; keeps at most `most` names
-- (a's first, then b's new ones by name), so a todo's and a tree's usage stay bounded
-- (todos.limits.MAX_USAGE_COUNTERS) however many reports name new counters.
-- The current text: change it here and add a migration that loads it (todos/sql/functions/__init__.py).
CREATE OR REPLACE FUNCTION todos_usage_add(a jsonb, b jsonb, most integer)
 RETURNS jsonb
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
BEGIN
    IF b IS NULL THEN
        RETURN a;
    END IF;
    RETURN (SELECT COALESCE(jsonb_object_agg(k, COALESCE((a ->> k)::numeric, 0) + COALESCE((b ->> k)::numeric, 0)),
                            '{}'::jsonb)
            FROM (SELECT k FROM (SELECT k, bool_or(old) AS old
                                 FROM (SELECT jsonb_object_keys(COALESCE(a, '{}'::jsonb)) AS k, true AS old
                                       UNION ALL SELECT jsonb_object_keys(b), false) x
                                 GROUP BY k) ks
                  ORDER BY old DESC, k LIMIT most) kept);
END
$function$;
