"""Request bodies' serializers build their fields once per class (todos/api/serializers.py, StrictInput):
each instance still gets fields of its own, bound to it, and validation in many threads at once gives
each body its own answer."""

from __future__ import annotations

import threading
from typing import Any

from todos.api import serializers


def test_each_instance_gets_its_own_bound_fields_and_the_template_stays_unbound() -> None:
    first, second = serializers.CompleteInput(data={}), serializers.CompleteInput(data={})
    for name in ("lease_id", "result", "usage"):
        assert first.fields[name] is not second.fields[name]
        assert first.fields[name].parent is first and second.fields[name].parent is second
        assert first.fields[name].field_name == name
    template = serializers._field_templates[serializers.CompleteInput]
    assert all(getattr(field, "parent", None) is None for field in template.values())
    # Nested serializers and fields with a child are still deep-copied: nothing bound is shared.
    one, two = serializers.HeartbeatInput(data={}), serializers.HeartbeatInput(data={})
    assert one.fields["progress"] is not two.fields["progress"]
    assert one.fields["progress"].parent is one
    claim_a, claim_b = serializers.ClaimNextInput(data={}), serializers.ClaimNextInput(data={})
    assert claim_a.fields["queues"].child is not claim_b.fields["queues"].child  # type: ignore[attr-defined]
    assert claim_a.fields["queues"].child.parent is claim_a.fields["queues"]  # type: ignore[attr-defined]


def _check(body: dict[str, Any]) -> Any:
    s = serializers.ClaimNextInput(data=body)
    return s.validated_data if s.is_valid() else s.errors


def test_bodies_validated_in_many_threads_at_once_each_get_their_own_answer() -> None:
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"queues": ["a.*"], "limit": 3}, None),
        ({"queues": ["b"], "wait_seconds": 2}, None),
        ({"limit": 0}, "limit"),
        ({"queues": "not-a-list"}, "queues"),
        ({"titel": "x"}, "titel"),
    ]
    expected = [_check(body) for body, _ in cases]
    for (_, field), answer in zip(cases, expected, strict=True):
        assert (field in answer) if field else ("limit" in answer)
    failures: list[str] = []
    start = threading.Barrier(8)

    def run(offset: int) -> None:
        start.wait()
        for i in range(300):
            k = (i + offset) % len(cases)
            got = _check(cases[k][0])
            if got != expected[k]:
                failures.append(f"{cases[k][0]}: {got!r} != {expected[k]!r}")

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
