"""Redis Streams: a pull-only provider. ``manage.py consume_stream`` reads a stream source's entries
through a consumer group (ingest/streams.py); nothing is POSTed and nothing is signed, so the webhook
receiver refuses deliveries to its sources and the source needs no secret. An entry's delivery id is its
``delivery_id`` field (else ``<stream>:<entry id>``), its type the ``type`` field, its payload the JSON in
``payload``: ingest/streams.py reads them, since they come from fields, not from headers."""

from __future__ import annotations

from typing import Any

from ingest.errors import InvalidDelivery
from ingest.providers.base import Provider, Verified

NAME = "stream"


def identify(verified: Verified, payload: dict[str, Any]) -> tuple[str, str]:
    raise InvalidDelivery("Stream entries are identified by their fields (ingest/streams.py), not by a delivery.")


PROVIDER = Provider(
    name=NAME,
    label="Redis Stream (manage.py consume_stream; no webhook)",
    verify=None,
    identify=identify,
)
