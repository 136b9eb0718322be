# The two commands: `make run` (the service: web + reaper) and `make test` (the suite).
# Both create .venv and install the pinned requirements first; nothing else is needed but Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-deps lint bench bench-http bench-compare drills migrate superuser clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The client (clients/python) is installed as a copy: a change to it reinstalls.
$(VENV)/.installed: $(BIN)/python requirements.txt requirements-dev.txt clients/python/pyproject.toml $(wildcard clients/python/src/switchboard_client/*.py)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@

# Local development settings (switchboard/settings.py reads .env; git-ignored). Written once, never
# overwritten: edit it freely. Commands run by hand then get the same settings as make run.
.env:
	@printf '# Local development settings (made by make; git-ignored). The environment wins over this file.\nDEBUG=true\nSECRET_KEY=%s\n' \
		"$$($(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(50))')" > $@
	@echo "Wrote .env (DEBUG=true and a generated SECRET_KEY) for local development."

# make run: a development service on http://127.0.0.1:$(PORT) (DEBUG on through .env, embedded
# PostgreSQL unless DATABASE_URL is set). Ctrl-C stops the web server, the reaper and the embedded
# database. Another port: make run PORT=8080.
PORT ?= 8000
run: export GUNICORN_BIND ?= 127.0.0.1:$(PORT)
run: $(VENV)/.installed .env
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py collectstatic --noinput -v 0
	@echo ""
	@echo "  Switchboard is starting (web + reaper). Ctrl-C stops everything."
	@echo "    API       http://$(GUNICORN_BIND)/api/v1/"
	@echo "    API docs  http://$(GUNICORN_BIND)/api/docs/"
	@echo "    Admin     http://$(GUNICORN_BIND)/admin/   (make superuser to create a login)"
	@echo ""
	$(BIN)/honcho start -f Procfile

# Interactive at a terminal; without one (scripts, CI) give DJANGO_SUPERUSER_USERNAME, _PASSWORD and
# _EMAIL and it runs with --noinput. Without either it fails instead of skipping quietly.
superuser: $(VENV)/.installed .env
	$(BIN)/python manage.py migrate --noinput -v 0
	@if [ -n "$$DJANGO_SUPERUSER_USERNAME" ]; then \
		$(BIN)/python manage.py createsuperuser --noinput; \
	elif [ -t 0 ]; then \
		$(BIN)/python manage.py createsuperuser; \
	else \
		echo "make superuser: no terminal; set DJANGO_SUPERUSER_USERNAME, DJANGO_SUPERUSER_PASSWORD and DJANGO_SUPERUSER_EMAIL" >&2; \
		exit 2; \
	fi

test: $(VENV)/.installed
	$(BIN)/pytest

# What the optional tests need beyond Python (as root, on Debian): Chromium for the browser tests,
# redis-server for streams, pgbouncer for the request-path tests, Node.js and the pinned TypeScript MCP
# client. Without them those tests skip, and `make test` lists what it skipped; CI runs this first.
test-deps:
	@missing=""; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	[ -x /usr/bin/redis-server ] || missing="$$missing redis-server"; \
	[ -x /usr/sbin/pgbouncer ] || missing="$$missing pgbouncer"; \
	command -v curl >/dev/null || missing="$$missing curl"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	command -v node >/dev/null || missing="$$missing nodejs"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
		export DEBIAN_FRONTEND=noninteractive; apt-get update -q && apt-get install -y -q $$missing; \
	fi
	npm ci --prefix todos/tests/mcp_ts --no-audit --no-fund

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# On demand: modes of bench/compare/compare.py (BENCH_ARGS=--quick for a short look). bench: queue.py against
# the same SQL on psycopg and pgbench at 1/2/4/8 clients; bench-http: over HTTP beside in-process.
BENCH_ARGS ?=
bench: $(VENV)/.installed
	$(BIN)/python bench/compare/compare.py --mode queue $(BENCH_ARGS)

bench-http: $(VENV)/.installed
	$(BIN)/python bench/compare/compare.py --mode http $(BENCH_ARGS)

# On demand, never in CI. bench-compare: Switchboard against raw SQL, Procrastinate and django-tasks
# (about 13 minutes; BENCH_COMPARE_ARGS=--quick checks the harness in 2). It rewrites the
# "Against the alternatives" section of docs/benchmarks.md and docs/img/throughput.png.
BENCH_COMPARE_ARGS ?= --docs
$(VENV)/.bench-installed: $(VENV)/.installed bench/compare/requirements-bench.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check -r bench/compare/requirements-bench.txt
	touch $@

bench-compare: $(VENV)/.bench-installed
	$(BIN)/python bench/compare/compare.py $(BENCH_COMPARE_ARGS)

# Failure drills (docs/reliability.md): each prints its figure and fails if an invariant breaks.
drills: $(VENV)/.installed
	$(BIN)/python -m bench.drills $(DRILLS)

clean:
	rm -rf $(VENV) .pgdata staticfiles
