"""Date-times at the edges of the representable range, in every date-time input of the admin API.

``9999-12-31T23:59:59-14:00`` is a valid RFC 3339 string whose UTC instant is in the year 10000,
which Python's datetime cannot hold: converting it raised OverflowError, answered as a 500. Each
input is checked on the way in; the instants that exist are accepted and read back.
"""

from __future__ import annotations

from typing import Any

import httpx2
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import Daemon

OUT_OF_RANGE = [
    "9999-12-31T23:59:59-14:00",
    "9999-12-31T23:00:00-01:00",
    "0001-01-01T00:00:00+14:00",
    "0001-01-01T00:59:59+01:00",
]
EDGES = ["9999-12-31T23:59:59Z", "9999-12-31T23:59:59.999999+00:00", "9999-12-31T09:59:59-14:00"]


def error(response: httpx2.Response, field: str) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    body: dict[str, Any] = response.json()["error"]
    assert body["field"] == field, body
    return body


async def group(daemon: Daemon) -> str:
    created = await daemon.admin.post("/groups", json={"name": "org"})
    assert created.status_code == 201, created.text
    group_id: str = created.json()["group"]["id"]
    return group_id


@pytest.mark.parametrize("value", OUT_OF_RANGE)
async def test_an_expiry_outside_the_range_is_a_400_naming_the_field(daemon: Daemon, value: str) -> None:
    group_id = await group(daemon)
    body = error(
        await daemon.admin.post("/keys", json={"name": "k", "group_id": group_id, "expires_at": value}), "expires_at"
    )
    assert "out of range" in body["message"]
    assert (await daemon.admin.get("/keys")).json()["keys"] == []


@pytest.mark.parametrize("value", EDGES)
async def test_the_last_representable_instant_is_a_valid_expiry(daemon: Daemon, value: str) -> None:
    group_id = await group(daemon)
    created = await daemon.admin.post("/keys", json={"name": "k", "group_id": group_id, "expires_at": value})
    assert created.status_code == 201, created.text
    (listed,) = (await daemon.admin.get("/keys")).json()["keys"]
    assert listed["expires_at"].startswith("9999-12-31T")


@pytest.mark.parametrize("name", ["since", "until"])
@pytest.mark.parametrize("value", OUT_OF_RANGE)
async def test_a_usage_bound_outside_the_range_is_a_400_naming_it(daemon: Daemon, name: str, value: str) -> None:
    body = error(await daemon.admin.get("/usage", params={name: value}), name)
    assert "out of range" in body["message"]


@pytest.mark.parametrize("name", ["since", "until"])
@pytest.mark.parametrize("value", [*EDGES, "0001-01-01T00:00:00Z", "0001-01-01T13:00:00+13:00"])
async def test_a_usage_bound_at_the_edge_is_answered(daemon: Daemon, name: str, value: str) -> None:
    response = await daemon.admin.get("/usage", params={name: value})
    assert response.status_code == 200, response.text


async def test_any_offset_at_any_edge_is_answered_200_or_400(daemon: Daemon) -> None:
    # Hypothesis drives a synchronous client in a thread: its examples cannot run inside trio's loop.
    def check(client: httpx2.Client) -> None:
        @settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(
            year=st.sampled_from([1, 2, 1970, 9998, 9999]),
            month=st.integers(1, 12),
            day=st.integers(1, 31),
            hour=st.integers(0, 23),
            offset=st.integers(-23 * 60 - 59, 23 * 60 + 59),
            name=st.sampled_from(["since", "until"]),
        )
        def one(year: int, month: int, day: int, hour: int, offset: int, name: str) -> None:
            sign = "-" if offset < 0 else "+"
            value = (
                f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:00:00{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"
            )
            response = client.get("/api/v1/usage", params={name: value})
            assert response.status_code in (200, 400), (value, response.text)

        one()

    with httpx2.Client(base_url=daemon.admin_url, timeout=20) as client:
        await trio.to_thread.run_sync(check, client)
