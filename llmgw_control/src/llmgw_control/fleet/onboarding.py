"""Onboarding a node: a join token, and the one command that installs ``llmgw-node`` on it.

``POST /api/v1/nodes`` (admin listener) creates a node identity in the store with a random join
token, kept only as its digest, and answers the token once with an install command. The command
downloads an install script from this daemon's agent listener, checks the script's sha256 (pinned
in the command, which the operator got over the admin API) and runs it. The script carries the
current node release's ``requirements.txt`` -- every wheel ``llmgw-node`` needs, pinned by sha256
to ``uv.lock`` (``llmgw-control release prepare``, see ``node_release``) -- and installs exactly
those with ``pip --require-hashes --no-index`` from this listener's
``/install/releases/<id>/``. Nothing fetched over the agent listener -- which may be plain HTTP --
is run unchecked, and nothing is resolved from a package index.

The join token never reaches a log: it is shown once in the API answer, travels in the command's
environment (not its arguments, visible in ``ps``) and ends in ``/etc/llmgw/node.toml`` (0640).
"""

from __future__ import annotations

import hashlib
import html
import secrets
import shlex
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import attrs
from quart import Response, abort, send_file
from quart_trio import QuartTrio

from llmgw_shared.logs import get_logger
from llmgw_shared.names import NODE_ID, NODE_ID_RULE
from llmgw_shared.threads import DISK, FILES

from ..store import InvalidInput, NodeIdentity, NotFound, Store
from .agents import token_digest
from .files import contained_file
from .node_release import RELEASE_ID, NodeReleaseError, Release, current_id, load_release

log = get_logger(__name__)

TOKEN_PREFIX = "llmgw-join-"
SCRIPT_PATH = "/install/node.sh"
RELEASES_PATH = "/install/releases/"
UNIT_NAME = "llmgw-node.service"
# Here-document markers in the script: the text they enclose must not contain them.
_UNIT_EOF = "LLMGW_UNIT_EOF"
_REQUIREMENTS_EOF = "LLMGW_REQUIREMENTS_EOF"


class OnboardingError(Exception):
    """Onboarding cannot work as configured; the message says what to do (answered as a 409)."""


def new_join_token() -> str:
    """256 random bits, in the format the log scrubber recognises (``llmgw-join-...``)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@attrs.frozen
class Created:
    node_id: str
    join_token: str = attrs.field(repr=False)
    install_command: str = attrs.field(repr=False)


def node_unit() -> str:
    """The systemd unit the script installs (the same file as examples/systemd/llmgw-node.service)."""
    return resources.files("llmgw_control").joinpath("units", UNIT_NAME).read_text()


class Onboarding:
    def __init__(self, store: Store, public_url: str, agent_ws_url: str, releases_dir: Path) -> None:
        self.store = store
        self.public_url = public_url.rstrip("/")
        self.agent_ws_url = agent_ws_url
        self.releases_dir = releases_dir
        # A prepared release never changes (a new one gets a new id): read each once.
        self._releases: dict[str, Release] = {}

    # ------------------------------------------------------------------ the release served

    async def release(self, release_id: str | None = None) -> Release:
        """The release ``release_id`` (default: the current one); ``OnboardingError`` says what to do."""
        if release_id is None:
            release_id = await DISK.run(current_id, self.releases_dir)
            if release_id is None:
                raise OnboardingError(
                    f"no node release in {self.releases_dir}: build the wheels and pin their dependencies with "
                    "`uv build --wheel --all-packages --out-dir dist && llmgw-control release prepare` in the source "
                    "tree (docs/operator-guide.md)"
                )
        if release_id not in self._releases:
            try:
                self._releases[release_id] = await FILES.run(load_release, self.releases_dir, release_id, abandon=True)
            except NodeReleaseError as exc:
                raise OnboardingError(str(exc)) from None
        return self._releases[release_id]

    async def release_file(self, release_id: str, name: str) -> Path | None:
        """A wheel of a prepared release by file name; never anything its manifest does not list."""
        if not RELEASE_ID.fullmatch(release_id):
            return None
        try:
            release = await self.release(release_id)
        except OnboardingError:
            return None
        if name not in release.files:
            return None
        # Listed is not enough: a link in the release directory must not lead out of it.
        return contained_file(release.path, name)

    async def index_html(self, release_id: str) -> str | None:
        """A pip ``--find-links`` page of the release's wheels, each with its sha256 for pip to check."""
        if not RELEASE_ID.fullmatch(release_id):
            return None
        try:
            release = await self.release(release_id)
        except OnboardingError:
            return None
        # Only what release_file serves: a page must not list a file that is then refused.
        served = await DISK.run(
            lambda: {name for name in release.files if contained_file(release.path, name) is not None}, abandon=True
        )
        rows = []
        for name, digest in sorted(release.files.items()):
            if name not in served:
                continue
            href = f"{quote(name)}#sha256={digest}"
            rows.append(f'<a href="{html.escape(href)}">{html.escape(name)}</a><br>')
        return "<!DOCTYPE html>\n<html><body>\n" + "\n".join(rows) + "\n</body></html>\n"

    # ------------------------------------------------------------------ the script and the command

    async def script(self) -> str:
        release = await self.release()
        values = {
            "CONTROL_HTTP": self.public_url,
            "CONTROL_WS": self.agent_ws_url,
            "RELEASE_ID": release.id,
            "NODE_VERSION": release.node_version,
            "TARGETS": " ".join(release.targets),
        }
        text = resources.files("llmgw_control").joinpath("units", "install-node.sh").read_text()
        settings = "\n".join(f"{key}={shlex.quote(value)}" for key, value in values.items())
        unit = node_unit()
        if _UNIT_EOF in unit or _REQUIREMENTS_EOF in release.requirements:
            raise OnboardingError("the node unit or the release's requirements contain the script's heredoc marker")
        return (
            text.replace("# @SETTINGS@", settings)
            .replace("@UNIT@\n", unit)
            .replace("@REQUIREMENTS@\n", release.requirements)
        )

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
            raise OnboardingError(
                f"nodes cannot reach {self.public_url}: set agents.public_url to the address "
                "nodes use for this daemon's agent listener"
            )
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


def register_install_routes(app: QuartTrio, onboarding: Onboarding | None) -> None:
    """On the agent listener: the install script, and each release's wheels as files and as a pip index."""
    if onboarding is None:
        return

    @app.get(SCRIPT_PATH)
    async def install_script() -> Any:
        try:
            text = await onboarding.script()
        except OnboardingError as exc:
            # Said in shell, so `sh` on the node prints it instead of running an error page.
            return Response(
                f"echo {shlex.quote('llmgw-node install: ' + str(exc))} >&2; exit 1\n",
                status=503,
                content_type="text/x-shellscript",
            )
        return Response(text, content_type="text/x-shellscript")

    @app.get(RELEASES_PATH + "<release_id>/")
    async def release_index(release_id: str) -> Any:
        page = await onboarding.index_html(release_id)
        if page is None:
            abort(404)
        return Response(page, content_type="text/html")

    @app.get(RELEASES_PATH + "<release_id>/<name>")
    async def release_file(release_id: str, name: str) -> Response:
        path = await onboarding.release_file(release_id, name)
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
