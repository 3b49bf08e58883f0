"""Onboarding a node: a join token, and the one command that installs ``llmgw-node`` on it.

``POST /api/v1/nodes`` (admin listener) creates a node identity in the store with a random join
token, kept only as its digest, and answers the token once with an install command. The command
downloads an install script from this daemon's agent listener, checks the script's sha256 (pinned
in the command, which the operator got over the admin API) and runs it; the script pins the
sha256 of the ``llmgw-shared`` and ``llmgw-node`` wheels it downloads next, so nothing fetched
over the agent listener -- which may be plain HTTP -- is run unchecked.

The wheels come from ``<files_dir>/wheels/`` (else ``<data_dir>/wheels/``), built with
``uv build --wheel --package llmgw-node`` and ``--package llmgw-shared``. The same directory is
served as a pip ``--find-links`` page, so dependency wheels put there install air-gapped nodes
(run the command with ``PIP_NO_INDEX=1``).

The join token never reaches a log: it is shown once in the API answer, travels in the command's
environment (not its arguments, visible in ``ps``) and ends in ``/etc/llmgw/node.toml`` (0640).
"""

from __future__ import annotations

import hashlib
import html
import re
import secrets
import shlex
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import attrs
import trio
from quart import Response, abort, send_file
from quart_trio import QuartTrio

from llmgw_shared.hashing import file_sha256
from llmgw_shared.logs import get_logger
from llmgw_shared.names import NODE_ID, NODE_ID_RULE

from ..store import InvalidInput, NodeIdentity, NotFound, Store
from .agents import token_digest
from .files import contained_file

log = get_logger("llmgw.onboarding")

TOKEN_PREFIX = "llmgw-join-"
_WHEEL = re.compile(r"^(?P<dist>[A-Za-z0-9_.]+)-(?P<version>[A-Za-z0-9_.+!]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
SCRIPT_PATH = "/install/node.sh"
WHEELS_PATH = "/install/wheels/"
UNIT_NAME = "llmgw-node.service"


class OnboardingError(Exception):
    """Onboarding cannot work as configured; the message says what to do (answered as a 409)."""


def new_join_token() -> str:
    """256 random bits, in the format the log scrubber recognises (``llmgw-join-...``)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@attrs.frozen
class Wheel:
    name: str
    sha256: str


@attrs.frozen
class Created:
    node_id: str
    join_token: str = attrs.field(repr=False)
    install_command: str = attrs.field(repr=False)


def _version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    # Enough of PEP 440 to pick the newest of a few builds: numeric parts compare as numbers.
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"[.+!_-]", version))


def node_unit() -> str:
    """The systemd unit the script installs (the same file as examples/systemd/llmgw-node.service)."""
    return resources.files("llmgw_control").joinpath("units", UNIT_NAME).read_text()


class Onboarding:
    def __init__(self, store: Store, public_url: str, agent_ws_url: str, wheels_dir: Path) -> None:
        self.store = store
        self.public_url = public_url.rstrip("/")
        self.agent_ws_url = agent_ws_url
        self.wheels_dir = wheels_dir
        self._digests: dict[tuple[str, int, int], str] = {}

    # ------------------------------------------------------------------ wheels

    def wheel_path(self, name: str) -> Path | None:
        """The real path of a wheel of the served directory, by file name; never anything outside it."""
        if not name.endswith(".whl"):
            return None
        return contained_file(self.wheels_dir, name)

    async def _sha256(self, path: Path) -> str:
        stat = await trio.to_thread.run_sync(path.stat)
        key = (path.name, stat.st_size, stat.st_mtime_ns)
        if key not in self._digests:
            self._digests[key] = await trio.to_thread.run_sync(file_sha256, path)
        return self._digests[key]

    def _listing(self) -> list[Path]:
        if not self.wheels_dir.is_dir():
            return []
        return sorted(p for p in self.wheels_dir.iterdir() if self.wheel_path(p.name) is not None)

    def _newest(self, dist: str) -> Path | None:
        found = []
        for path in self._listing():
            match = _WHEEL.fullmatch(path.name)
            if match and match["dist"].lower().replace(".", "_") == dist:
                found.append((_version_key(match["version"]), path))
        return max(found)[1] if found else None

    async def wheels(self) -> list[Wheel]:
        """The llmgw-shared and llmgw-node wheels the script installs (newest of each)."""
        listing = await trio.to_thread.run_sync(lambda: [self._newest("llmgw_shared"), self._newest("llmgw_node")])
        if None in listing:
            raise OnboardingError(
                f"no llmgw-shared and llmgw-node wheels in {self.wheels_dir}: build them with "
                f"`uv build --wheel --package llmgw-shared --package llmgw-node --out-dir {self.wheels_dir}`")
        return [Wheel(p.name, await self._sha256(p)) for p in listing if p is not None]

    async def index_html(self) -> str:
        """A pip ``--find-links`` page of every wheel served, each with its sha256 for pip to check."""
        rows = []
        for path in await trio.to_thread.run_sync(self._listing):
            digest = await self._sha256(path)
            href = f"{quote(path.name)}#sha256={digest}"
            rows.append(f'<a href="{html.escape(href)}">{html.escape(path.name)}</a><br>')
        return "<!DOCTYPE html>\n<html><body>\n" + "\n".join(rows) + "\n</body></html>\n"

    # ------------------------------------------------------------------ the script and the command

    async def script(self) -> str:
        wheels = await self.wheels()
        values = {
            "CONTROL_HTTP": self.public_url,
            "CONTROL_WS": self.agent_ws_url,
            "SHARED_WHEEL": wheels[0].name,
            "SHARED_SHA256": wheels[0].sha256,
            "NODE_WHEEL": wheels[1].name,
            "NODE_SHA256": wheels[1].sha256,
        }
        text = resources.files("llmgw_control").joinpath("units", "install-node.sh").read_text()
        settings = "\n".join(f"{key}={shlex.quote(value)}" for key, value in values.items())
        unit = node_unit()
        if "LLMGW_UNIT_EOF" in unit:
            raise OnboardingError("the node unit contains the script's heredoc marker")
        return text.replace("# @SETTINGS@", settings).replace("@UNIT@\n", unit)

    def command(self, node_id: str, token: str, script_sha256: str) -> str:
        """One shell command: fetch the script, check its sha256, run it with the id and token."""
        url = self.public_url + SCRIPT_PATH
        inner = (
            f'f=$(mktemp) && curl -fsSL {shlex.quote(url)} -o "$f" && '
            f'echo "{script_sha256}  $f" | sha256sum -c --quiet - && '
            f'LLMGW_NODE_ID={shlex.quote(node_id)} LLMGW_JOIN_TOKEN={shlex.quote(token)} sh "$f"; '
            f's=$?; rm -f "$f"; exit $s'
        )
        return f"sh -c {shlex.quote(inner)}"

    # ------------------------------------------------------------------ the API's verb

    async def create(self, name: str, labels: Mapping[str, str]) -> Created:
        if not isinstance(name, str) or not NODE_ID.fullmatch(name):
            raise ValueError(f"name: use {NODE_ID_RULE}")
        host = urlsplit(self.public_url).hostname or ""
        if host in ("0.0.0.0", "::", ""):
            raise OnboardingError(f"nodes cannot reach {self.public_url}: set agents.public_url to the address "
                                  "nodes use for this daemon's agent listener")
        # Before the identity exists: a node that cannot be installed should not be half-created.
        script = await self.script()
        token = new_join_token()
        await self.store.add_node(name, token_digest(token), dict(labels))
        log.info("node %s registered for onboarding", name, extra={"node": name, "labels": dict(labels)})
        sha = hashlib.sha256(script.encode()).hexdigest()
        return Created(name, token, self.command(name, token, sha))

    async def new_token(self, node_id: str) -> Created:
        """Replace a node's join token (lost, leaked); ``NotFound`` when it was never onboarded.

        A node connected with the old token stays connected until it reconnects; it then needs
        the new one, which the install command writes (or edit ``token`` in its config).
        """
        script = await self.script()
        token = new_join_token()
        await self.store.update_node(node_id, token_digest=token_digest(token))
        log.info("node %s has a new join token", node_id, extra={"node": node_id})
        sha = hashlib.sha256(script.encode()).hexdigest()
        return Created(node_id, token, self.command(node_id, token, sha))


def wheels_dir_for(files_dir: str, data_dir: Path) -> Path:
    return Path(files_dir) / "wheels" if files_dir else data_dir / "wheels"


def register_install_routes(app: QuartTrio, onboarding: Onboarding | None) -> None:
    """On the agent listener: the install script, and the wheels as files and as a pip index."""
    if onboarding is None:
        return

    @app.get(SCRIPT_PATH)
    async def install_script() -> Any:
        try:
            text = await onboarding.script()
        except OnboardingError as exc:
            # Said in shell, so `sh` on the node prints it instead of running an error page.
            return Response(f"echo {shlex.quote('llmgw-node install: ' + str(exc))} >&2; exit 1\n", status=503,
                            content_type="text/x-shellscript")
        return Response(text, content_type="text/x-shellscript")

    @app.get(WHEELS_PATH)
    async def wheel_index() -> Any:
        return Response(await onboarding.index_html(), content_type="text/html")

    @app.get(WHEELS_PATH + "<name>")
    async def wheel(name: str) -> Response:
        path = onboarding.wheel_path(name)
        if path is None:
            abort(404)
        response = await send_file(path, conditional=True, mimetype="application/octet-stream")
        response.timeout = None
        return response


def stored_identity(store: Store) -> Callable[[str], Awaitable[NodeIdentity | None]]:
    """For the agent service: the identity (join-token digest, labels) onboarding stored for a node id."""

    async def lookup(node_id: str) -> NodeIdentity | None:
        try:
            return await store.get_node(node_id)
        except (NotFound, InvalidInput):
            return None

    return lookup
