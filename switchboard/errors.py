"""The one base of every error an app raises for the API layer to answer: a ``code`` that
switchboard/api.py's STATUS_BY_CODE turns into a status, a human ``detail``, and ``extra`` fields for
the body (e.g. ``state`` on a conflict). The apps subclass it; none of them knows HTTP."""

from __future__ import annotations

from typing import Any, ClassVar


class ApplicationError(Exception):
    code: ClassVar[str] = "error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra
