from llmgw_control.store import SqlStore, latest_version


async def test_opens_at_latest_schema(store: SqlStore) -> None:
    assert await store.schema_version() == latest_version()
