"""PostgreSQL stopped under the web front end and the images API: users read that the
database is not answering (503), not that the server broke (500)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from comfyveil.store import database
from tests.api.test_api_openai import make_key
from tests.integration.test_worker_recovery import restartable_pg  # noqa: F401 (fixture)
from tests.web.support import client, get_text, sign_up, web_stack

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

SENTENCE = "database is not answering right now; try again in a minute."


async def test_a_stopped_database_is_said_in_a_sentence_on_the_pages_and_the_api(
    restartable_pg: Any,  # noqa: F811
    fake_comfy_factory,
) -> None:
    from pgserver import _commands

    url = restartable_pg.get_uri()
    conn = await database.connect(url)
    try:
        await database.migrate(conn)
    finally:
        await conn.close()
    db = await database.Database.open(url=url, run_migrations=False, max_size=4)
    fake = await fake_comfy_factory()
    try:
        async with web_stack(db, [fake], worker=False, api=True) as stack, client() as session:
            await sign_up(session, await stack.invite(), "dora")
            key = await make_key(session, stack.url)

            await asyncio.to_thread(
                _commands.pg_ctl,
                ["-w", "-m", "fast", "stop"],
                pgdata=restartable_pg.pgdata,
                user=restartable_pg.system_user,
            )

            status, page = await get_text(session, stack.url + "/c/f")
            assert status == 503, page
            assert SENTENCE in page and "Something went wrong" not in page

            async with session.post(
                stack.url + "/v1/images/generations",
                json={"model": "f", "prompt": "a fox"},
                headers={"Authorization": f"Bearer {key}"},
            ) as response:
                body = await response.json()
            assert response.status == 503, body
            assert SENTENCE in body["error"]["message"]
    finally:
        await db.close()
