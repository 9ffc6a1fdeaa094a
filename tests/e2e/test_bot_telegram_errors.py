"""The errors Telegram answers with, and what the user still gets: a refused photo comes
as a file, a blocked bot stops trying, a deleted status message is left alone, a "not
modified" or a 429 pauses nothing that matters."""

from __future__ import annotations

from typing import Any

import pytest

from comfyveil.telegram import app
from tests.e2e.bot_support import SMALL, no_call, running_bot, to_chat
from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.telegram import NOT_MODIFIED, FakeTelegram
from tests.integration.worker_support import wait_for

pytestmark = pytest.mark.timeout(120)


async def test_a_photo_telegram_refuses_is_sent_as_a_file(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    fake_telegram.fail_next("sendPhoto", 400, "Bad Request: PHOTO_INVALID_DIMENSIONS")
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(60, f"/f a very wide lake {SMALL}")
        document = await stack.result(60, method="sendDocument")
        job = (await db.jobs.list_for_user(60, limit=1))[0]
        assert document.files["document"][1] == (await db.jobs.outputs(job.id))[0].data
        assert document.result["caption"].startswith("/f")
    refused = fake_telegram.calls("sendPhoto", ok=False)
    assert [c.error for c in refused] == ["Bad Request: PHOTO_INVALID_DIMENSIONS"]
    assert fake_telegram.calls("sendPhoto") == []  # one result, as a file only


async def test_a_user_who_blocked_the_bot_is_not_sent_to_again_and_others_are_served(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    slow = await fake_comfy_factory(step_delay=0.5)  # 2 s: blocked before the result
    async with running_bot(fake_telegram, db, [slow]) as stack:
        stack.send(61, f"/f a fox --steps 4 {SMALL}")
        await fake_telegram.wait_for_call("sendMessage", chat_id=61)  # the status
        fake_telegram.block_bot(61)
        job = (await db.jobs.list_for_user(61, limit=1))[0]

        async def delivered() -> bool:
            current = await db.jobs.get(job.id)
            assert current is not None
            return current.status.finished and await db.jobs.undelivered("telegram") == []

        # The refused result leaves the queue of deliveries to make now: it waits for the
        # delivery backoff (30 s), it does not knock again at once. (A delivery in flight
        # is not "undelivered" either: the refused result itself is waited for first.)
        await fake_telegram.wait_for(
            lambda calls: [c for c in calls if not c.ok and to_chat(61, "sendPhoto")(c)],
            timeout=20,
        )
        await wait_for(delivered, timeout=20)
        refused = fake_telegram.calls(ok=False)
        assert refused and all("blocked" in str(c.error) for c in refused)
        # The catch-up looks every second: none of its rounds may send to 61 now.
        await no_call(fake_telegram, to_chat(61), within=3.0)
        stack.send(62, f"/f a cat --steps 1 {SMALL}")  # the bot still serves the others
        await stack.result(62)


async def test_a_status_message_the_user_deleted_is_left_alone(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    slow = await fake_comfy_factory(step_delay=0.5)
    async with running_bot(fake_telegram, db, [slow]) as stack:
        stack.send(63, f"/f a heron --steps 8 {SMALL}")
        status = await fake_telegram.wait_for_call("sendMessage", chat_id=63)
        message_id = status.result["message_id"]
        await fake_telegram.wait_for_call("editMessageText", chat_id=63)  # it is followed
        fake_telegram.user_deletes(63, message_id)
        photo = await stack.result(63, timeout=30)
        assert photo.result["caption"].startswith("/f")
    edits = [c for c in fake_telegram.sent if to_chat(63, "editMessageText")(c)]
    refused = [c for c in edits if not c.ok]
    # One refused edit tells the bot the message is gone (the job ran seconds more, with
    # progress to show); it stops editing it.
    assert [c.error for c in refused] == ["Bad Request: message to edit not found"]
    assert not [c for c in edits if c.ok and c.at > photo.at]


async def test_not_modified_and_a_rate_limit_do_not_stop_the_status_or_the_result(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    slow = await fake_comfy_factory(step_delay=2.0)  # 16 s: still running after the 429s
    async with running_bot(fake_telegram, db, [slow]) as stack:
        stack.send(64, f"/f a lynx --steps 8 {SMALL}")
        status = await fake_telegram.wait_for_call("sendMessage", chat_id=64)
        fake_telegram.fail_next("editMessageText", 400, NOT_MODIFIED)
        await fake_telegram.wait_for(
            lambda calls: any(not c.ok and c.method == "editMessageText" for c in calls)
        )
        # Telegram's 429 with a whole second to wait, more often than PTB's limiter retries:
        # the status message's edits pause for that second, then go on.
        fake_telegram.rate_limit_next(4, retry_after=1)
        limited = await fake_telegram.wait_for(
            lambda calls: [c for c in calls if c.error and "Too Many" in c.error][3:4],
            timeout=20,
        )
        last_429 = limited[0]
        assert to_chat(64, "editMessageText")(last_429)  # the tracker's edit got it
        following = await fake_telegram.wait_for(
            lambda calls: [
                c
                for c in calls
                if c.at > last_429.at and c.ok and to_chat(64, "editMessageText")(c)
            ][:1],
            timeout=20,
        )
        assert following[0].at - last_429.at >= 0.9  # Telegram asked for a second
        assert not fake_telegram.calls("sendPhoto"), "the job ended before the test was done"
        slow.step_delay = 0.01  # seen enough: let the job finish
        await stack.result(64, timeout=30)
        await fake_telegram.wait_for(
            lambda _: status.result["message_id"] in fake_telegram.deleted(64), timeout=10
        )


async def test_an_update_the_bot_cannot_read_is_skipped_and_polling_goes_on(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db, caplog
) -> None:
    # A message whose date is text: PTB's Update.de_json raised TypeError inside its
    # polling loop, which catches only TelegramError, and the bot heard nothing more.
    fake_telegram._push_update({"message": {"message_id": 1, "date": "soon", "chat": 5}})
    fake_telegram._push_update({"callback_query": {"id": "1"}})  # a required field missing
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(64, f"/f a fox after the noise {SMALL}")
        photo = await stack.result(64)
        assert photo.result["caption"].startswith("/f")
    skipped = [r for r in caplog.records if getattr(r, "action", "") == "update_unreadable"]
    assert len(skipped) == 2
    assert all("soon" not in r.getMessage() for r in caplog.records)


async def test_an_answer_larger_than_any_the_bot_api_sends_is_refused_unread() -> None:
    from aiohttp import web

    from comfyveil.telegram import request as bot_request

    async def huge(_request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(_request)
        chunk = b"x" * (1024 * 1024)
        for _ in range(bot_request.MAX_ANSWER_BYTES // len(chunk) + 2):
            await response.write(chunk)
        return response

    app = web.Application()
    app.router.add_post("/bot1:x/getMe", huge)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = bot_request.AiohttpRequest()
    await client.initialize()
    try:
        with pytest.raises(bot_request.AnswerTooLarge):
            await client.do_request(f"http://127.0.0.1:{port}/bot1:x/getMe", "POST")
    finally:
        await client.shutdown()
        await runner.cleanup()


async def test_a_refusal_the_bot_api_fails_to_take_is_sent_again(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    """A refusal is the user's only answer: a 500 or a lost connection while sending it
    must not swallow it."""
    fake_telegram.fail_next("sendMessage", 500, "Internal Server Error")
    fake_telegram.fail_next("sendMessage", 502, "Bad Gateway")
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(65, f"/f a fox --steps banana {SMALL}")
        answer = await fake_telegram.wait_for_call("sendMessage", chat_id=65, timeout=20)
    assert "Steps must be a whole number" in answer.result["text"]
    failed = [c for c in fake_telegram.calls(ok=False) if to_chat(65, "sendMessage")(c)]
    assert [c.error for c in failed] == ["Internal Server Error", "Bad Gateway"]
    assert await db.jobs.list_for_user(65, limit=1) == []


async def test_a_refusal_telegram_keeps_asking_to_wait_for_is_still_sent(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    """A 429 the rate limiter's own retries did not outlast (Telegram asked again and
    again) must not swallow the refusal either: it is the user's only answer."""
    for _ in range(app.RATE_LIMIT_RETRIES + 2):
        fake_telegram.fail_next(
            "sendMessage", 429, "Too Many Requests: retry after 1", {"retry_after": 1}
        )
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(67, f"/f a fox --steps banana {SMALL}")
        answer = await fake_telegram.wait_for_call("sendMessage", chat_id=67, timeout=30)
    assert "Steps must be a whole number" in answer.result["text"]
    failed = [c for c in fake_telegram.calls(ok=False) if to_chat(67, "sendMessage")(c)]
    assert len(failed) == app.RATE_LIMIT_RETRIES + 2


async def test_a_cancelled_jobs_sentence_is_written_again_after_a_bot_api_failure(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    """The status message's last edit is the job's one sentence: a 500 must not leave it
    saying the job is queued."""
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False) as stack:
        stack.send(66, f"/f a wren {SMALL}")
        status = await fake_telegram.wait_for_call("sendMessage", chat_id=66)
        fake_telegram.fail_next("editMessageText", 500, "Internal Server Error")
        stack.send(66, "/cancel")

        def says(text: str) -> Any:
            def check(_calls: Any) -> bool:
                shown = [
                    m
                    for m in fake_telegram.messages(66)
                    if m["message_id"] == status.result["message_id"]
                ]
                return bool(shown) and shown[0].get("text") == text

            return check

        await fake_telegram.wait_for(says("Cancelled."), timeout=20)
    failed = [c for c in fake_telegram.calls(ok=False) if to_chat(66, "editMessageText")(c)]
    assert [c.error for c in failed] == ["Internal Server Error"]
