"""Which processes share their quotas (``quotas_shared``), and two holders on one SQLite file.

The quick-tier guard of issue 29, part 1: the workers of one daemon are several daemons on one
store, on SQLite as on PostgreSQL. The process-level proof is tests/control/test_worker_quotas.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from control.tenancy.support import bearer

from llmgw_control.api_errors import ClientApiError
from llmgw_control.tenancy.admission import admit_waiting
from llmgw_control.tenancy.tenancy import open_tenancy, quotas_shared


def test_a_worker_shares_its_quotas_on_any_store() -> None:
    assert quotas_shared("/var/lib/llmgw/llmgw.db", worker=True)
    assert quotas_shared("postgresql://db/llmgw", worker=True)
    assert quotas_shared("postgresql://db/llmgw", worker=False)
    # Only a daemon alone on its SQLite file keeps the exact, I/O-free admission.
    assert not quotas_shared("/var/lib/llmgw/llmgw.db", worker=False)


@pytest.mark.parametrize("shared", [True, False])
async def test_two_holders_on_one_sqlite_file_admit_one_limit(tmp_path: Path, shared: bool) -> None:
    location = str(tmp_path / "llmgw.db")
    limit = 8
    async with (
        open_tenancy(location, tmp_path, shared=shared) as one,
        open_tenancy(location, tmp_path, shared=shared) as two,
    ):
        assert (one.admission.book is not None) is shared
        org = await one.service.create_group("org")
        team = await one.service.create_group("team", org.id)
        await one.service.set_quota(org.id, {"requests_per_minute": limit})
        key = await one.service.create_key(name="k", group_id=team.id)
        await two.state.refresh()
        admitted = 0
        for i in range(2 * limit):
            tenancy = (one, two)[i % 2]
            try:
                ticket = await admit_waiting(tenancy.admission, bearer(key.secret), "m", estimated_tokens=1)
            except ClientApiError as refused:
                assert refused.status == 429
                continue
            ticket.settle(1, 1)
            admitted += 1
        if shared:
            assert admitted == limit  # every one of the limit, none past it
        else:
            assert admitted == 2 * limit  # each counts alone: why a worker must never be unshared
