"""The node and model lists kept per backend (store/model_lists.py) are written when they
change, not at every re-read: each write of a real /object_info (1-2 MB) left a dead copy
that VACUUM makes reusable but never gives back (the hour's chaos run: the database 13 %
larger after retention, most of it this table's TOAST)."""

from __future__ import annotations

import random

from comfyveil import config
from comfyveil.store import database


def lists(models: int, seed: int = 1) -> dict[str, object]:
    """An /object_info-like document too varied to compress into its row (kept in TOAST)."""
    rng = random.Random(seed)
    names = [f"model-{rng.getrandbits(64):016x}.safetensors" for _ in range(models)]
    return {"CheckpointLoaderSimple": {"input": {"required": {"ckpt_name": [names]}}}}


async def table_bytes(db: database.Database) -> int:
    async with db.pool.connection() as conn:
        cur = await conn.execute("SELECT pg_total_relation_size('backend_model_lists') AS n")
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def test_lists_read_again_unchanged_are_not_written_again(db: database.Database) -> None:
    gpu = config.BackendConfig(name="gpu0", url="http://127.0.0.1:8188")
    info = lists(4000)  # about 200 KB
    await db.model_lists.remember(gpu, info)
    first = await table_bytes(db)
    for _ in range(20):  # re-read every few minutes, and after each outage
        await db.model_lists.remember(gpu, info)
    # One copy kept, as after the first read (each write added one: 1.7 MB after 20).
    assert await table_bytes(db) <= first + 16 * 1024
    assert (await db.model_lists.recall([gpu]))["gpu0"] == info


async def test_lists_that_changed_are_kept_as_they_are_now(db: database.Database) -> None:
    gpu = config.BackendConfig(name="gpu0", url="http://127.0.0.1:8188")
    await db.model_lists.remember(gpu, lists(10, seed=1))
    installed = lists(11, seed=2)  # a model installed since
    await db.model_lists.remember(gpu, installed)
    assert (await db.model_lists.recall([gpu]))["gpu0"] == installed
    moved = config.BackendConfig(name="gpu0", url="http://127.0.0.1:8189")
    await db.model_lists.remember(moved, installed)  # same lists, another address
    assert (await db.model_lists.recall([moved]))["gpu0"] == installed
