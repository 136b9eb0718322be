"""The no-op job Procrastinate's workers run."""

from procrastinate.contrib.django import app


@app.task(name="noop")
def noop() -> None:
    return None
