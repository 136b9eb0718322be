"""manage.py notify as a real process (the Procfile's notify line): it sends what is queued while it runs,
and SIGTERM stops it promptly with exit status 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from todos.models import Todo, TodoState
from todos.notices import Notice, notify_url
from todos.tests.test_reap_leases import BASE_DIR, _reaper_env, _stop, _wait_for


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_sidecar_sends_while_it_runs_and_stops_on_a_signal(receiver, sig):
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "notify", "--interval", "0.2"],
        cwd=BASE_DIR,
        env=_reaper_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        delivery = notify_url(
            url=receiver.url + "/hook",
            secret="whsec_c2VjcmV0",
            notice=Notice(key="k", event="e", subject="s", text="t"),
        )
        assert _wait_for(lambda: len(receiver.requests) == 1, timeout=30), "the sidecar never sent"
        assert _wait_for(
            lambda: Todo.objects.values_list("state", flat=True).get(pk=delivery) == TodoState.DONE, timeout=5
        )
        proc.send_signal(sig)
        sent = time.monotonic()
        proc.wait(timeout=5)
        stopped_after = time.monotonic() - sent
    finally:
        output = _stop(proc)
    assert proc.returncode == 0, output
    assert stopped_after < 3.0, f"took {stopped_after:.2f}s to stop"
    assert "notify drain" in output and "sent=1" in output and "notify stopped" in output, output
