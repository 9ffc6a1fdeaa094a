"""A message the bot was still handling when it died is fetched again by the next bot:
getUpdates leaves it unconfirmed until its handler ended (the bot's polls, against the
fake Bot API)."""

from __future__ import annotations

import telegram

from comfyveil.telegram import updates
from comfyveil.telegram.request import AiohttpRequest
from tests.fakes.telegram import FakeTelegram


def _bot(fake: FakeTelegram, handling: updates.Handling | None) -> telegram.Bot:
    return telegram.Bot(
        fake.token,
        base_url=fake.base_url,
        get_updates_request=AiohttpRequest(connection_pool_size=1, handling=handling),
    )


async def test_an_update_still_being_handled_is_fetched_again_after_a_crash(
    fake_telegram: FakeTelegram,
) -> None:
    handling = updates.Handling()
    first = _bot(fake_telegram, handling)
    await first.initialize()
    try:
        sent = fake_telegram.user_sends(71, "/f a lark")
        [fetched] = await first.get_updates(offset=0, timeout=0)
        assert fetched.message is not None
        assert fetched.message.message_id == sent["message_id"]
        # PTB asks for the next ones at once, its handler still running: nothing new,
        # and what it has is not handed to it twice
        assert await first.get_updates(offset=fetched.update_id + 1, timeout=0) == ()
    finally:
        await first.shutdown()  # the process dies here, the message unanswered

    handling_again = updates.Handling()
    second = _bot(fake_telegram, handling_again)
    await second.initialize()
    try:
        [again] = await second.get_updates(offset=0, timeout=0)
        assert again.update_id == fetched.update_id  # the restarted bot gets it
        handling_again.done(again.update_id)  # handled this time
        assert await second.get_updates(offset=again.update_id + 1, timeout=0) == ()
    finally:
        await second.shutdown()
    third = _bot(fake_telegram, updates.Handling())
    await third.initialize()
    try:
        assert await third.get_updates(offset=0, timeout=0) == ()  # confirmed once handled
    finally:
        await third.shutdown()
