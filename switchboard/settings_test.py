"""Settings for the test suite: the production settings with a throwaway key.

Tests run with DEBUG off, as production does; only the key and hosts are filled in.
"""

import os

# A developer's .env (make run's) must not turn DEBUG on under the tests.
os.environ.setdefault("ENV_FILE", "")
os.environ.setdefault("SECRET_KEY", "test-only-secret-key-not-for-production-0123456789abcdef")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost,127.0.0.1")
os.environ.setdefault("SECURE_SSL_REDIRECT", "false")

from switchboard.settings import *  # noqa: F403

# Tests render admin pages without running collectstatic first.
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # noqa: F405
# No collectstatic before tests: WhiteNoise serves from the apps' static folders (finders) and does
# not look for STATIC_ROOT at start-up (it would warn, and warnings are errors here).
WHITENOISE_AUTOREFRESH = True
WHITENOISE_USE_FINDERS = True
# The stall hook (switchboard/test_hooks.py), for the watchdog's test on a real server; off otherwise.
TEST_HOOKS = os.environ.get("SWITCHBOARD_TEST_HOOKS") == "1"
# The tests' webhook receivers and SMTP server listen on loopback (test_security_outbound.py turns it off; a
# live server for an attack test is started with OUTBOUND_GUARD_ON=1, test_security_events.py).
OUTBOUND_ALLOW_PRIVATE_NETWORKS = os.environ.get("OUTBOUND_GUARD_ON") != "1"
