"""A new seed is new: the chat's re-roll button and /again, the web's Run again and each of
an API request's n images draw a fresh seed even when the operator's workflow declares a
default for it, so the strict fake ComfyUI runs the sampler each time instead of answering
the last image from its execution cache."""

from __future__ import annotations

import uuid
from pathlib import Path

from comfyveil.comfy import workflow
from comfyveil.store import database
from tests.e2e.bot_support import running_bot
from tests.fakes.comfyui import FakeComfyUI
from tests.web.support import client, csrf_of, get_text, sign_up, wait_for, web_stack

DATA = Path(__file__).parents[1] / "data" / "workflows"
SAMPLER = "3"  # the KSampler of seeded.json


async def add_seeded(db: database.Database) -> None:
    """The operator's `comfyveil workflows add seeded.toml`: `[params.seed]` is an int
    with `default = 1`."""
    toml = DATA / "seeded.toml"
    wf = workflow.load(toml)
    await db.commands.add(wf, toml.read_text(), toml.with_suffix(".json").read_text())


def sampled_afresh(fake: FakeComfyUI, job_ids: list[uuid.UUID]) -> list[int]:
    """The seed each job's prompt gave the sampler, checking that the sampler really ran:
    not listed in `execution_cached` (an answer from the cache is the last image again)."""
    seeds = []
    for job_id in job_ids:
        posted = [p for p in fake.prompts if p["prompt_id"] == str(job_id)]
        assert posted, f"job {job_id} never reached ComfyUI"
        seeds.append(posted[-1]["prompt"][SAMPLER]["inputs"]["seed"])
        assert SAMPLER not in fake.cached_nodes[str(job_id)], "answered from the cache"
    return seeds


async def finished_jobs(db: database.Database, count: int) -> list[uuid.UUID]:
    async def done() -> bool:
        async with db.pool.connection() as conn:
            cursor = await conn.execute("SELECT count(*) AS n FROM jobs WHERE status = 'succeeded'")
            row = await cursor.fetchone()
        return row is not None and int(row["n"]) >= count

    await wait_for(done, timeout=30)
    async with db.pool.connection() as conn:
        cursor = await conn.execute("SELECT id FROM jobs ORDER BY created_at")
        return [row["id"] for row in await cursor.fetchall()]


async def test_reroll_and_again_in_the_chat_draw_new_seeds(fake_telegram, db, fake_comfy) -> None:
    await add_seeded(db)
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(61, "/seeded a fox in snow")
        photo = await stack.result(61)
        reroll = photo.result["reply_markup"]["inline_keyboard"][0][0]
        fake_telegram.user_presses(61, photo.result["message_id"], reroll["callback_data"])
        await stack.result(61, count=2)
        stack.send(61, "/again")
        await stack.result(61, count=3)
        job_ids = await finished_jobs(db, 3)
    seeds = sampled_afresh(fake_comfy, job_ids)
    assert len(set(seeds)) == 3, seeds


async def test_run_again_on_the_web_draws_a_new_seed(db, fake_comfy) -> None:
    await add_seeded(db)
    async with web_stack(db, [fake_comfy]) as stack, client() as session:
        await sign_up(session, await stack.invite(), "rae")
        _, page = await get_text(session, stack.url + "/c/seeded")
        assert 'name="seed" value=""' in page  # the default is not offered as the seed
        async with session.post(
            stack.url + "/c/seeded", data={"csrf": csrf_of(page), "prompt": "a fox in snow"}
        ) as response:
            assert response.status == 200
            first = uuid.UUID(str(response.url).rsplit("/", 1)[1])
        await finished_jobs(db, 1)
        for nonce in ("again1", "again2"):
            _, page = await get_text(session, f"{stack.url}/jobs/{first}")
            async with session.post(
                f"{stack.url}/jobs/{first}/again", data={"csrf": csrf_of(page), "nonce": nonce}
            ) as response:
                assert response.status == 200
        job_ids = await finished_jobs(db, 3)
    seeds = sampled_afresh(fake_comfy, job_ids)
    assert len(set(seeds)) == 3, seeds


async def test_each_of_n_images_through_the_api_has_its_own_seed(db, fake_comfy) -> None:
    from tests.api.test_api_openai import make_key, sdk

    await add_seeded(db)
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "ann")
        api = sdk(stack.url, await make_key(session, stack.url))
        result = await api.images.generate(model="seeded", prompt="a fox", n=3)
        assert len(result.data) == 3
        job_ids = await finished_jobs(db, 3)
    seeds = sampled_afresh(fake_comfy, job_ids)
    assert len(set(seeds)) == 3, seeds
