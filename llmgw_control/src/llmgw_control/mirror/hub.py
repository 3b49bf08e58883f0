"""Searching the Hub and listing a repository's GGUF files, through ``huggingface-hub``.

The library is the Hub's own client: it knows the API's paths, pagination and error shapes.
It sends through our client (``hub_http.py``): every request, redirect and next page passes the
download's URL guard, the token goes to the endpoint's origin only, and the whole call has a
deadline (``hub.timeout``) that each connect and read is cut to. It is blocking (httpx2's sync
client), so each call runs in a thread of the ``hub`` pool (``llmgw_shared.threads``): a Hub that
stalls fills that pool and no other; when it is full a call is answered 503 ``hub_busy`` at once.
The trio side waits a little past the deadline and then abandons the thread (so shutdown never
waits on the Hub); the thread ends by the deadline on its own. Its endpoint is the configured
one and it never reads a token from the machine (``token=False`` unless ``hub.token_file``/the
environment gives one), so what it sends is what ``[hub]`` says.

Downloads do not use the library (see ``download.py``): they must pass the SSRF guard on
every redirect, resume into control's files directory and report progress to a trio task,
none of which ``hf_hub_download`` lets a caller do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar
from urllib.parse import quote

import attrs
import httpx2
import trio
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.hf_api import RepoFile

from llmgw_shared.threads import HUB, Busy

from ..api_errors import AdminApiError
from .config import HubConfig
from .hub_http import CURRENT_CALL, HubAnswered, HubCall, HubRefused, HubStalled, HubUnreachable, install
from .names import is_split, quantisation
from .net_guard import NetGuard

T = TypeVar("T")

# How long past the call's deadline the trio side waits for its thread before abandoning it: the
# thread's requests end at the deadline, but a DNS lookup (the resolver's own timeout) may not.
_ABANDON_AFTER = 1.0
# A repository with more files than this is listed in part (GGUF repos hold tens).
_MAX_TREE = 2000


@attrs.frozen
class HubRepo:
    id: str
    downloads: int
    likes: int
    updated: str


@attrs.frozen
class HubFile:
    path: str
    size: int
    sha256: str
    quantisation: str
    split: bool


class Hub:
    def __init__(self, config: HubConfig, guard: NetGuard | None = None) -> None:
        self.config = config
        self.endpoint = config.endpoint
        self.guard = guard if guard is not None else NetGuard(config)
        install()

    def _api(self) -> HfApi:
        return HfApi(
            endpoint=self.endpoint, token=self.config.token() or False, library_name="llmgw", library_version="0.1"
        )

    async def _call(self, fn: Callable[[], T]) -> T:
        call = HubCall(self.guard, time.monotonic() + self.config.timeout)

        def in_thread() -> T:
            # The transport reads the call's rules from here (a thread runs in a copy of the context).
            CURRENT_CALL.set(call)
            return fn()

        try:
            with trio.fail_after(self.config.timeout + _ABANDON_AFTER):
                return await HUB.run_or_busy(in_thread, abandon=True)
        except Busy as exc:
            raise AdminApiError(
                503,
                "hub_busy",
                f"{exc.size} Hub calls are already waiting on the Hub at {self.endpoint}: try again later",
            ) from None
        except (trio.TooSlowError, HubStalled):
            raise AdminApiError(
                504,
                "hub_timeout",
                f"the Hub at {self.endpoint} did not answer within hub.timeout ({self.config.timeout:g} s)",
            ) from None
        except HubRefused as exc:
            raise AdminApiError(502, "hub_refused", f"the Hub client was refused: {str(exc)[:300]}") from None
        except httpx2.InvalidURL as exc:  # a next page or redirect the client cannot even parse
            raise AdminApiError(502, "hub_refused", f"the Hub sent a URL that is not valid: {_short(exc)}") from None
        except HubAnswered as exc:
            raise AdminApiError(502, "hub_error", str(exc)) from None
        except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
            raise AdminApiError(404, "not_found", f"not on the Hub: {_short(exc)}") from None
        except HfHubHTTPError as exc:
            raise AdminApiError(502, "hub_error", f"the Hub answered an error: {_short(exc)}") from None
        except (HubUnreachable, OSError) as exc:
            raise AdminApiError(
                502, "hub_unreachable", f"the Hub at {self.endpoint} is unreachable: {_short(exc)}"
            ) from None
        except (httpx2.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # Too many redirects, a body that is not JSON or not the shape the library reads.
            raise AdminApiError(502, "hub_error", f"the Hub's answer could not be read: {type(exc).__name__}") from None

    async def search(self, text: str, limit: int | None = None) -> list[HubRepo]:
        """GGUF repositories matching ``text``, most downloaded first."""
        count = min(limit or self.config.search_limit, self.config.search_limit)

        def run() -> list[HubRepo]:
            found = self._api().list_models(search=text or None, filter="gguf", sort="downloads", limit=count)
            return [HubRepo(m.id, int(m.downloads or 0), int(m.likes or 0), _when(m.last_modified)) for m in found]

        return await self._call(run)

    async def gguf_files(self, repo: str, revision: str = "main") -> list[HubFile]:
        """The repository's GGUF files, with the LFS sha256 the Hub holds for each."""

        def run() -> list[HubFile]:
            files = []
            for count, entry in enumerate(self._api().list_repo_tree(repo, recursive=True, revision=revision)):
                if count >= _MAX_TREE:
                    break
                if isinstance(entry, RepoFile) and entry.path.lower().endswith(".gguf") and entry.lfs:
                    files.append(
                        HubFile(
                            entry.path,
                            int(entry.lfs.size),
                            str(entry.lfs.sha256),
                            quantisation(entry.path),
                            is_split(entry.path),
                        )
                    )
            return files

        return await self._call(run)

    def resolve_url(self, repo: str, revision: str, path: str) -> str:
        return f"{self.endpoint}/{repo}/resolve/{quote(revision, safe='')}/{quote(path)}"


def _when(value: datetime | None) -> str:
    return value.isoformat() if value else ""


def _short(exc: Exception) -> str:
    # The library's messages hold the URL and a request id; the first line is the meaning.
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
