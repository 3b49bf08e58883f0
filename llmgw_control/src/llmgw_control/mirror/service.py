"""The model mirror as one daemon built it: the Hub client, and the pulls when there is a files
directory to pull into (``agents.files_dir``)."""

from __future__ import annotations

import attrs

from .hub import Hub
from .pulls import Pulls


@attrs.define
class Mirror:
    hub: Hub
    pulls: Pulls | None = None
