"""ctl never sends a control character that came from elsewhere to the terminal (issue 29 §5).

Every command that prints remote data runs through ``ctl.main`` against a fake admin API whose
every string is hostile (C0 and C1 controls, ESC sequences that retitle the window or set the
clipboard, BEL, CR, bidi overrides, lone surrogates): what reaches stdout and stderr holds no
control, format or separator character but the line breaks ctl writes itself.
"""

from __future__ import annotations

import importlib
import io
import json
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw_control.ctl import main as ctl
from llmgw_control.ctl.client import CtlError
from llmgw_control.ctl.terminal import TerminalOut, escape

ctl_main = importlib.import_module("llmgw_control.ctl.main")
mirror_cmds = importlib.import_module("llmgw_control.ctl.mirror_cmds")
bench_cmds = importlib.import_module("llmgw_control.ctl.bench_cmds")

_UNSAFE = {"Cc", "Cf", "Cs", "Zl", "Zp"}
_controls = st.sampled_from(
    [chr(c) for c in range(0x20)]
    + ["\x7f"]
    + [chr(c) for c in range(0x80, 0xA0)]
    + ["\u202e", "\u202a", "\u2066", "\u2069", "\u200f", "\u061c", "\u2028", "\u2029", "\ud800", "\U000e0001"]
)
_sequences = st.sampled_from(
    [
        "\x1b[31m",
        "\x1b]0;pwned\x07",
        "\x1b]52;c;ZXZpbA==\x07",
        "\x1b[2J\x1b[H",
        "\x9b31m",
        "\x1bP+q\x1b\\",
        "\r",
        "\x08\x08",
        "\x1b[6n",
        "\u202eexe.txt",
    ]
)
hostile = st.lists(st.one_of(st.text(max_size=4), _controls, _sequences), min_size=1, max_size=6).map("".join)


def unsafe(text: str) -> list[str]:
    return [c for c in text if c != "\n" and unicodedata.category(c) in _UNSAFE]


class FakeAdmin:
    """Answers each (method, path) with the answer given (a list: one answer a call, in turn)."""

    def __init__(self, routes: dict[tuple[str, str], Any]) -> None:
        self.routes = routes

    def __call__(self, base_url: str) -> FakeAdmin:
        return self

    def __enter__(self) -> FakeAdmin:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def call(self, method: str, path: str, **_: Any) -> Any:
        answer = self.routes[(method, path.split("?")[0])]
        if isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path)

    def put(self, path: str, body: Any) -> Any:
        return self.call("PUT", path)

    def patch(self, path: str, body: Any) -> Any:
        return self.call("PATCH", path)

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)


def _pull(h: str, state: str) -> dict[str, Any]:
    return {
        "id": "p1",
        "state": state,
        "name": h,
        "size": 10,
        "bytes": 4,
        "rate": 1.0,
        "eta_seconds": 3,
        "error": h,
        "draft": {"name": h, "profiles": [{"context": h}]},
        "sha256": h,
        "estimate_ram_mib": 1,
        "estimate_how": h,
    }


def _run(h: str, state: str) -> dict[str, Any]:
    level = {
        "concurrency": 1,
        "generation_tokens_per_s": 1.0,
        "prompt_tokens_per_s": 2.0,
        "ttft_p50_s": 0.1,
        "ttft_p99_s": 0.2,
        "itl_p50_s": 0.01,
        "itl_p99_s": 0.02,
        "requests": 3,
        "errors": 0,
        "meets_objective": None,
    }
    return {
        "id": "c1",
        "model": h,
        "profile": h,
        "levels": [1],
        "level_seconds": 1.0,
        "node_id": h,
        "node": h,
        "replica_id": h,
        "started_replica": True,
        "results": [level],
        "state": state,
        "error": h,
        "slots": None,
        "levels_done": 1,
        "comparable": {"engine": h, "engine_version": h},
    }


def routes(h: str) -> dict[tuple[str, str], Any]:
    """One answer per path, every string in it ``h``, shaped as the admin API answers."""
    groups = {"groups": [{"path": h, "id": "g1", "priority": None, "effective_priority": h}]}
    return {
        ("GET", "/nodes"): {
            "role": "standby",
            "leader": h,
            "nodes": [
                {
                    "id": h,
                    "state": h,
                    "cordoned": False,
                    "address": h,
                    "facts": {"cpu": h, "cores": 4, "ram_total_mib": 8},
                    "shards": [h],
                    "engines": [{"name": h, "version": h, "state": h}],
                    "warnings": [h],
                }
            ],
        },
        ("POST", "/nodes/n1/drain"): {"node": {"id": h}, "drained": [h]},
        ("POST", "/nodes/n1/cordon"): CtlError(f"node {h!s} not found (HTTP 404)"),
        ("POST", "/nodes"): {"node_id": h, "join_token": h, "install_command": h},
        ("GET", "/replicas"): {
            "role": "standby",
            "leader": h,
            "replicas": [
                {"id": h, "model": h, "node": h, "port": 1, "routable": True, "in_flight": 0, "status": h, "detail": h}
            ],
        },
        ("GET", "/replicas/r1/logs"): [
            {"lines": [h, h], "source": "failure", "node": h, "status": h, "detail": h, "cursor": "c"},
            {"lines": [h], "source": "node", "node": h, "status": h, "detail": h, "cursor": None},
        ],
        ("GET", "/engines"): {
            "engines": [
                {"name": h, "version": h, "nodes": [{"node": h, "state": h, "provenance": {"kind": h}}]},
                {"name": h, "version": h, "nodes": []},
            ]
        },
        ("GET", "/weights"): {
            "nodes": [
                {
                    "node": h,
                    "reported": True,
                    "weights": [{"sha256": h, "size": 1 << 20, "in_use": False, "last_used": h, "models": [h]}],
                },
                {"node": h, "reported": False, "weights": []},
            ]
        },
        ("GET", "/models"): {
            "models": [
                {
                    "key": h,
                    "source": h,
                    "ready": 0,
                    "replicas": [],
                    "waiting_requests": 0,
                    "claim": {"ram_mib": 1},
                    "status": h,
                }
            ]
        },
        ("GET", "/models/m1"): {"model": {"name": h}},
        ("GET", "/models/m1/profiles/p1/adapters"): {
            "adapters": [{"name": h, "size": 1, "scale": 1.0, "loaded_on": [h], "url": h, "sha256": h}]
        },
        ("PATCH", "/models/m1/profiles/p1/adapters/a1"): {
            "name": h,
            "size": 1,
            "scale": 2.0,
            "loaded_on": [h],
            "url": h,
            "sha256": h,
        },
        ("GET", "/hub/search"): {"endpoint": h, "repos": [{"id": h, "downloads": 1, "likes": 2, "updated": h}]},
        ("GET", "/hub/files"): {
            "files": [{"path": h, "quantisation": h, "size": 1, "estimate_ram_mib": 1, "fits": True, "split": True}]
        },
        ("GET", "/models/pulls"): {"pulls": [_pull(h, h)]},
        ("POST", "/models/pulls"): {"pull": _pull(h, "downloading")},
        ("GET", "/models/pulls/p1"): {"pull": _pull(h, "failed")},
        ("POST", "/models/pulls/p1/publish"): {"model": {"name": h}},
        ("GET", "/groups"): groups,
        ("GET", "/keys"): {
            "keys": [{"id": h, "name": h, "group_id": "g1", "state": h, "admin": False, "models": [h], "expires_at": h}]
        },
        ("GET", "/quotas"): {
            "quotas": [
                {
                    "path": h,
                    "requests_per_minute": 1,
                    "tokens_per_minute": None,
                    "tokens_per_day": None,
                    "concurrent_requests": None,
                }
            ]
        },
        ("PUT", "/groups/g1/quota"): {
            "quota": {
                "path": h,
                "requests_per_minute": 1,
                "tokens_per_minute": None,
                "tokens_per_day": None,
                "concurrent_requests": None,
            }
        },
        ("POST", "/groups"): {"group": {"path": h, "id": h}},
        ("PATCH", "/groups/g1"): {"group": {"path": h, "priority": "batch", "effective_priority": h}},
        ("POST", "/keys"): {"key": {"id": h, "name": h}, "secret": h},
        ("GET", "/usage"): {
            "usage": [
                {
                    "hour": h,
                    "group_id": "g1",
                    "key_id": h,
                    "model": h,
                    "requests": 1,
                    "prompt_tokens": 2,
                    "completion_tokens": 3,
                }
            ],
            "totals": {"requests": 1, "prompt_tokens": 2, "completion_tokens": 3},
        },
        ("GET", "/capacity/runs"): {"runs": [_run(h, h)]},
        ("POST", "/capacity/runs"): {"run": _run(h, "running")},
        ("GET", "/capacity/runs/c1"): {"run": _run(h, "failed")},
        ("POST", "/sessions/revoke"): {"subject": h, "revoked_before": h},
        ("GET", "/audit"): {
            "entries": [
                {
                    "at": h,
                    "actor": h,
                    "peer": h,
                    "outcome": h,
                    "action": h,
                    "resource": h,
                    "resource_id": h,
                    "changes": {h: [h, h]},
                }
            ],
            "next_cursor": None,
        },
    }


# Every command that prints what the API answered (the rest print only the operator's own words).
COMMANDS = [
    ["nodes"],
    ["nodes", "drain", "n1"],
    ["nodes", "cordon", "n1"],
    ["nodes", "add", "n2"],
    ["replicas"],
    ["replicas", "logs", "r1", "--follow"],
    ["engines"],
    ["weights"],
    ["models"],
    ["models", "show", "m1"],
    ["models", "search", "q"],
    ["models", "files", "o/r"],
    ["models", "pulls"],
    ["models", "pull", "o/r", "f.gguf"],
    ["models", "publish", "p1"],
    ["models", "adapters", "list", "m1", "--profile", "p1"],
    ["groups"],
    ["groups", "create", "g"],
    ["groups", "priority", "g1", "batch"],
    ["keys"],
    ["keys", "create", "k", "--group", "g1"],
    ["quotas"],
    ["quotas", "set", "g1", "--requests-per-minute", "1"],
    ["usage"],
    ["capacity"],
    ["bench", "m"],
    ["audit"],
    ["audit", "export"],
    ["sessions", "revoke", "ada"],
]


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(mirror_cmds, "POLL_SECONDS", 0)
    monkeypatch.setattr(bench_cmds, "POLL_SECONDS", 0)
    yield


def run_ctl(monkeypatch: pytest.MonkeyPatch, h: str, argv: list[str]) -> tuple[int, str, str]:
    monkeypatch.setattr(ctl_main, "AdminClient", FakeAdmin(routes(h)))
    out, err = io.StringIO(), io.StringIO()
    code = ctl(argv, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def check(monkeypatch: pytest.MonkeyPatch, argv: list[str], json_output: bool, h: str) -> None:
    code, out, err = run_ctl(monkeypatch, h, (["--json"] if json_output else []) + argv)
    if argv[1:2] == ["pull"] and not json_output:
        # The progress bar's own sequences, sent on purpose: back to the line's start, erase to its end.
        out = out.replace("\r", "").replace("\x1b[K", "")
    assert unsafe(out) == [] and unsafe(err) == []
    assert code in (0, 1)
    if "\x1b" in h:
        assert "\\x1b" in out + err or "\\u001b" in out + err  # shown, not dropped


# Each of the issue's classes at once: an OSC title and clipboard write ended by BEL, CSI, a C1
# CSI, CR, backspaces, a bidi override, a line separator, a lone surrogate, a tag character.
WORST = "a\x1b]0;t\x07\x1b]52;c;eA==\x07\x1b[2J\x9b1m\r\x08\u202eb\u2028\ud800\U000e0001\x00\n"


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("json_output", [False, True], ids=["table", "json"])
def test_no_remote_control_character_reaches_the_terminal(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], json_output: bool
) -> None:
    check(monkeypatch, argv, json_output, WORST)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=st.sampled_from(COMMANDS), json_output=st.booleans(), h=hostile)
def test_no_generated_control_character_reaches_the_terminal(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], json_output: bool, h: str
) -> None:
    check(monkeypatch, argv, json_output, h)


def test_table_cells_are_one_line_whatever_the_hub_names(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = run_ctl(monkeypatch, "evil\nFAKE-ROW  1  2\r\x1b]0;pwned\x07", ["models", "search", "q"])
    assert code == 0
    _, row = out.splitlines()
    assert row.startswith("evil\\x0aFAKE-ROW  1  2\\x0d\\x1b]0;pwned\\x07")


def test_the_examples_of_the_issue_are_shown_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    line = "loading model\x1b]0;owned\x07\x1b[2J done\x07"
    code, out, _ = run_ctl(monkeypatch, line, ["replicas", "logs", "r1"])
    assert code == 0
    assert out.splitlines()[0] == "loading model\\x1b]0;owned\\x07\\x1b[2J done\\x07"
    assert "\x1b" not in out and "\x07" not in out


def test_text_and_json_pass_unchanged() -> None:
    plain = "naïve 模型 👍 \u00a0tab-free, back\\slash"
    assert escape(plain) == plain
    assert escape("a\nb") == "a\nb" and escape("a\nb", keep="") == "a\\x0ab"
    assert escape("\x1b\x9b\u202e\ud800\U000e0001") == "\\x1b\\x9b\\u202e\\ud800\\U000e0001"
    sink = io.StringIO()
    TerminalOut(sink).write(json.dumps({"line": "\x1b[31m\u202e"}))
    assert json.loads(sink.getvalue()) == {"line": "\x1b[31m\u202e"}


def _every_action() -> Iterator[Callable[..., Any]]:
    parser = ctl_main.build_parser()
    stack = [parser]
    while stack:
        p = stack.pop()
        action = p.get_default("action")
        if action is not None:
            yield action
        for sub in p._subparsers._group_actions if p._subparsers else []:
            stack.extend(sub.choices.values())


def test_every_command_that_reads_the_api_is_covered() -> None:
    covered = set()
    parser = ctl_main.build_parser()
    for argv in COMMANDS:
        covered.add(parser.parse_args(argv).action)
    # Commands left out print only what the operator typed (removals, revocations, clearings).
    own_words = {
        "models_remove",
        "models_add",
        "models_change",
        "groups_delete",
        "keys_revoke",
        "keys_delete",
        "quotas_clear",
        "act",
        "adapters_add",
        "adapters_remove",
        "adapters_scale",
    }
    missing = {a.__name__ for a in _every_action() if a not in covered} - own_words
    assert missing == set()
