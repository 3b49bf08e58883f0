"""A profile key: which profile of which model, the key replicas are registered and counted under.

It is written ``model:profile`` only at the edges (a client's model name, the admin API, the
store, metric labels, the gateway's replica set); ``parse`` is the one place that reads that
form from untrusted text, and ``str()`` the one place that writes it.
"""

from __future__ import annotations

import re

import attrs

# Model, profile and adapter names. No ':' (it separates model from profile), and 96 characters
# keep a key within a metric label and a log line.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,95}$")


@attrs.frozen(cache_hash=True)
class ProfileKey:
    """``model``'s profile ``profile``. Frozen and hashable (the hash is cached), so it can key a
    dict; the gateway's per-request lookups use the string form, which needs no parse."""

    model: str
    profile: str

    def __str__(self) -> str:
        return f"{self.model}:{self.profile}"

    @classmethod
    def parse(cls, text: object) -> ProfileKey | None:
        """The key ``text`` writes as ``model:profile``, both valid names; None otherwise."""
        if not isinstance(text, str):
            return None
        model, colon, profile = text.partition(":")
        if not colon or not NAME.fullmatch(model) or not NAME.fullmatch(profile):
            return None
        return cls(model, profile)

    @staticmethod
    def model_of(profile_key: str) -> str:
        """The model part of a key string this process wrote (a static replica's model name is
        its own key): cheap on the hot path, where the key came out of the catalog, not a client."""
        return profile_key.partition(":")[0]
