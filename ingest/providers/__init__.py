"""The webhook providers, registered in this one place. Each module holds one provider whole: its
verification, how it finds the delivery id and event type, the headers it keeps and its secrets.

Adding a provider is one new module here (a ``PROVIDER = Provider(...)``, see base.py) plus its tests,
and its name in the tuple below. Source.provider's choices, the receiver (ingest/views.py), add_source
and the admin all read ``PROVIDERS``.
"""

from __future__ import annotations

from ingest.providers import github, hmac, standard, stream, stripe
from ingest.providers.base import Provider, Verified, verify_nothing

__all__ = ["PROVIDERS", "Provider", "Verified", "choices", "get", "verify_nothing"]

PROVIDERS: dict[str, Provider] = {
    p.name: p for p in (github.PROVIDER, stripe.PROVIDER, standard.PROVIDER, hmac.PROVIDER, stream.PROVIDER)
}


def get(name: str) -> Provider:
    """The provider a source names. A KeyError means a source row names a provider this code does not
    have (the model's choices stop that at every write path but raw SQL)."""
    return PROVIDERS[name]


def choices() -> list[tuple[str, str]]:
    """Source.provider's choices: a callable, so adding a provider needs no migration."""
    return [(p.name, p.label) for p in PROVIDERS.values()]
