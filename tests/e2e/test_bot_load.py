"""Many users at once: fairness, no lost or duplicated replies, Telegram's 429s."""

from __future__ import annotations

import asyncio
from collections import Counter

from comfyveil import config
from tests.e2e.bot_support import SMALL, no_call, running_bot
from tests.fakes.telegram import FakeTelegram


async def test_a_batch_does_not_starve_another_user(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    gpu = await fake_comfy_factory(step_delay=0.05)
    limits = config.LimitsConfig(max_queued=10)
    async with running_bot(fake_telegram, db, [gpu], limits=limits) as stack:
        for i in range(5):
            stack.send(50, f"/f batch {i} --steps 4 {SMALL}")
        # All five queued (their status messages trickle out: one a second to one chat).
        async with asyncio.timeout(10):
            while await stack.queued_count() < 5:
                await asyncio.sleep(0.05)
        stack.send(51, f"/f just one --steps 4 {SMALL}")
        b = await stack.result(51, timeout=30)
        a_last = await stack.result(50, count=5, timeout=30)
        assert b.at < a_last.at, "B's only job waited behind all of A's batch"


async def test_fifty_users_at_once_each_get_exactly_one_result(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    gpus = [await fake_comfy_factory(), await fake_comfy_factory()]
    users = list(range(1000, 1050))
    async with running_bot(fake_telegram, db, gpus) as stack:
        for user in users:
            stack.send(user, f"/f portrait of user {user} {SMALL}")
        await fake_telegram.wait_for(
            lambda calls: len([c for c in calls if c.method == "sendPhoto" and c.ok]) >= 50,
            timeout=60,
        )
        # A duplicate would follow within a delivery round: wait on a 51st photo.
        await no_call(fake_telegram, lambda c: c.method == "sendPhoto", within=2.0)
        photos = Counter(int(c.params["chat_id"]) for c in fake_telegram.calls("sendPhoto"))
        assert photos == Counter({user: 1 for user in users})
        assert sum(len(gpu.prompts) for gpu in gpus) == 50
        # Every status message is removed once its result arrived (the deletions queue
        # behind the photos in the rate limiter, so they may come a little later).
        await fake_telegram.wait_for(
            lambda _: all(
                all("photo" in m for m in fake_telegram.bot_messages(user)) for user in users
            ),
            timeout=30,
        )


async def test_a_429_during_status_edits_does_not_lose_the_result(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    gpu = await fake_comfy_factory(step_delay=0.15)
    async with running_bot(fake_telegram, db, [gpu]) as stack:
        stack.send(52, f"/f a fox --steps 8 {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=52)
        fake_telegram.rate_limit_next(6, retry_after=0.3)
        photo = await stack.result(52, timeout=30)
        refused = [c for c in fake_telegram.calls(ok=False) if "Too Many" in (c.error or "")]
        assert refused, "Telegram never answered 429"
        await no_call(fake_telegram, lambda c: c.method == "sendPhoto", within=1.5)
        assert len(fake_telegram.calls("sendPhoto")) == 1
        assert photo.result["caption"].startswith("/f")
