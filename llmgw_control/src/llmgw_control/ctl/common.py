"""What every ``ctl`` noun module shares: how a noun and its verbs are declared, and how answers print.

Each noun module (``node_cmds.py``, ``model_cmds.py``, ...) has one ``add_*`` that declares its
noun and verbs through ``Nouns``; ``main.py`` composes them in the order ``ctl --help`` lists them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, TextIO
from urllib.parse import quote

from .client import AdminClient

Action = Callable[[AdminClient, argparse.Namespace, TextIO], None]


class Nouns:
    """The ``NOUN`` subcommands of ``ctl``; every parser made here takes the common options too."""

    def __init__(self, subparsers: Any, common: argparse.ArgumentParser) -> None:
        self.subparsers = subparsers
        self.common = common

    def noun(self, name: str, help: str, default: Action | None) -> Any:
        """A noun and the subparsers for its verbs; ``default`` is what the noun alone runs (None: a verb is needed)."""
        p = self.subparsers.add_parser(name, help=help, parents=[self.common])
        verbs = p.add_subparsers(dest="verb", metavar="VERB", required=default is None)
        if default is not None:
            p.set_defaults(action=default)
        return verbs

    def verb(self, verbs: Any, name: str, action: Action, help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = verbs.add_parser(name, help=help, parents=[self.common])
        p.set_defaults(action=action)
        return p

    def parser(self, name: str) -> argparse.ArgumentParser:
        """A noun's own parser: options given to the noun alone (``ctl keys --group G``) are declared on it."""
        found: argparse.ArgumentParser = self.subparsers.choices[name]
        return found


def q(segment: str) -> str:
    """A path segment: ids and names may hold characters with a meaning in URLs."""
    return quote(segment, safe="")


def emit(out: TextIO, args: argparse.Namespace, answer: Any, human: Callable[[], str]) -> None:
    if args.json:
        out.write(json.dumps(answer, indent=2) + "\n")
    else:
        text = human()
        if text:
            out.write(text + "\n")


def said(text: str) -> Callable[[], str]:
    return lambda: text


def standby_note(answer: dict[str, Any]) -> list[str]:
    """The line that says a listing is the leader's fleet as a standby reads it from the store."""
    if answer.get("role") != "standby":
        return []
    return [f"(a standby: the leader's fleet from the store; leader: {answer.get('leader') or 'unknown'})"]
