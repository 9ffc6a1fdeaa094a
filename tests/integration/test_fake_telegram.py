"""python-telegram-bot 22 against the fake Bot API: the fake is faithful enough for PTB."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
from collections.abc import AsyncIterator

import pytest
from PIL import Image
from telegram import (
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    InputMediaPhoto,
    Message,
    Update,
    error,
)
from telegram.ext import (
    AIORateLimiter,
    Application,
    CallbackQueryHandler,
    CommandHandler,
    ContextTypes,
    MessageHandler,
    filters,
)

from comfyveil.telegram.request import AiohttpRequest
from tests.fakes import telegram as fake

USER = 1001


def png(width: int, height: int, color: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Echo the arguments of /echo."""
    assert update.effective_message is not None
    await update.effective_message.reply_text(
        "echo: " + " ".join(context.args or []), do_quote=True
    )


async def picture(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Send a 640x360 PNG with a button, then edit a status message."""
    assert update.effective_chat is not None
    status = await context.bot.send_message(update.effective_chat.id, "Queued #1")
    await status.edit_text("Running <b>50%</b>", parse_mode="HTML")
    keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("Re-roll", callback_data="again:1")]])
    await context.bot.send_photo(
        update.effective_chat.id, png(640, 360), caption="/pic · seed 1", reply_markup=keyboard
    )


async def photo_in(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Download the user's photo and report its size."""
    message = update.effective_message
    assert message is not None
    telegram_file = await message.photo[-1].get_file()
    data = await telegram_file.download_as_bytearray()
    with Image.open(io.BytesIO(bytes(data))) as image:
        await message.reply_text(f"got {image.width}x{image.height}")


async def pressed(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    """Answer a button press."""
    query = update.callback_query
    assert query is not None
    await query.answer("Re-rolling")
    await query.edit_message_caption(f"pressed {query.data}")


# PTB's own HTTP layer shows the fake is faithful; ours (the bot's) must behave the same.
@pytest.fixture(params=["httpx", "aiohttp"])
async def app(
    fake_telegram: fake.FakeTelegram, request: pytest.FixtureRequest
) -> AsyncIterator[Application]:  # type: ignore[type-arg]
    builder = (
        Application.builder()
        .token(fake_telegram.token)
        .base_url(fake_telegram.base_url)
        .base_file_url(fake_telegram.base_file_url)
        .rate_limiter(AIORateLimiter(max_retries=2))
    )
    if request.param == "aiohttp":
        builder = builder.request(AiohttpRequest()).get_updates_request(AiohttpRequest())
    application = builder.build()
    application.add_handler(CommandHandler("echo", echo))
    application.add_handler(CommandHandler("pic", picture))
    application.add_handler(MessageHandler(filters.PHOTO, photo_in))
    application.add_handler(CallbackQueryHandler(pressed))
    await application.initialize()
    await application.start()
    assert application.updater is not None
    await application.updater.start_polling(poll_interval=0, timeout=1)
    try:
        yield application
    finally:
        await application.updater.stop()
        await application.stop()
        await application.shutdown()


async def test_command_is_answered_in_the_users_chat(
    app: Application,
    fake_telegram: fake.FakeTelegram,  # type: ignore[type-arg]
) -> None:
    sent = fake_telegram.user_sends(USER, "/echo hello fox")
    call = await fake_telegram.wait_for_call("sendMessage", chat_id=USER)
    assert call.result["text"] == "echo: hello fox"
    assert call.result["reply_to_message"]["message_id"] == sent["message_id"]
    texts = [m.get("text") for m in fake_telegram.messages(USER)]
    assert texts == ["/echo hello fox", "echo: hello fox"]


async def test_commands_addressed_to_the_bot_in_a_group_reach_the_handler(
    app: Application,
    fake_telegram: fake.FakeTelegram,  # type: ignore[type-arg]
) -> None:
    group = -100500
    fake_telegram.user_sends(USER, "/echo@OtherBot no", chat_id=group, chat_type="supergroup")
    fake_telegram.user_sends(
        USER, "/echo@ComfyveilTestBot yes", chat_id=group, chat_type="supergroup"
    )
    call = await fake_telegram.wait_for_call("sendMessage", chat_id=group)
    assert call.result["text"] == "echo: yes"
    await asyncio.sleep(0.1)
    assert len(fake_telegram.calls("sendMessage")) == 1


async def test_photo_upload_status_edit_and_button_press(
    app: Application,
    fake_telegram: fake.FakeTelegram,  # type: ignore[type-arg]
) -> None:
    fake_telegram.user_sends(USER, "/pic")
    photo_call = await fake_telegram.wait_for_call("sendPhoto", chat_id=USER)

    assert photo_call.files["photo"][1] == png(640, 360)  # the bytes PTB uploaded
    sizes = photo_call.result["photo"]
    assert [(s["width"], s["height"]) for s in sizes] == [(90, 51), (320, 180), (640, 360)]
    assert all(s["file_size"] > 0 and s["file_unique_id"] for s in sizes)

    status, photo = fake_telegram.bot_messages(USER)
    assert status["text"] == "Running 50%"
    assert status["entities"] == [{"type": "bold", "offset": 8, "length": 3}]
    assert "edit_date" in status
    assert photo["caption"] == "/pic · seed 1"

    query_id = fake_telegram.user_presses(USER, photo["message_id"], "again:1")
    await fake_telegram.wait_for_call("editMessageCaption", chat_id=USER)
    assert fake_telegram.callback_answers[query_id]["text"] == "Re-rolling"
    assert fake_telegram.bot_messages(USER)[1]["caption"] == "pressed again:1"


async def test_bot_downloads_a_users_photo_through_get_file(
    app: Application,
    fake_telegram: fake.FakeTelegram,  # type: ignore[type-arg]
) -> None:
    fake_telegram.user_sends(USER, photo=png(2000, 1000, "blue"), caption="look")
    call = await fake_telegram.wait_for_call("sendMessage", chat_id=USER)
    # Telegram recompresses photos: the largest PhotoSize is at most 1280 px wide.
    assert call.result["text"] == "got 1280x640"
    assert fake_telegram.calls("getFile")


async def test_rate_limited_call_is_retried_by_the_rate_limiter(
    app: Application,
    fake_telegram: fake.FakeTelegram,  # type: ignore[type-arg]
) -> None:
    fake_telegram.rate_limit_next(1, retry_after=0.2)
    fake_telegram.user_sends(USER, "/echo again")
    call = await fake_telegram.wait_for_call("sendMessage", chat_id=USER)
    assert call.result["text"] == "echo: again"
    refused = fake_telegram.calls("sendMessage", ok=False)
    assert [c.error for c in refused] == ["Too Many Requests: retry after 0.2"]
    assert call.at - refused[0].at >= 0.2


async def test_errors_reach_ptb_as_its_exception_types(
    app: Application,
    fake_telegram: fake.FakeTelegram,  # type: ignore[type-arg]
) -> None:
    bot = app.bot
    fake_telegram.user_sends(USER, "hi")
    message = await bot.send_message(USER, "same")
    with pytest.raises(error.BadRequest, match=r"(?i)message is not modified"):
        await message.edit_text("same")
    with pytest.raises(error.BadRequest, match=r"(?i)chat not found"):
        await bot.send_message(424242, "nobody")
    with pytest.raises(error.BadRequest, match=r"(?i)can.t parse entities"):
        await bot.send_message(USER, "<fox>", parse_mode="HTML")
    with pytest.raises(error.BadRequest, match=r"(?i)message to delete not found"):
        await bot.delete_message(USER, 999)
    assert await bot.delete_message(USER, message.message_id)
    assert message.message_id in fake_telegram.deleted(USER)
    assert all(m["message_id"] != message.message_id for m in fake_telegram.messages(USER))
    fake_telegram.fail_next("sendMessage", 403, "Forbidden: bot was blocked by the user")
    with pytest.raises(error.Forbidden):
        await bot.send_message(USER, "blocked")
    fake_telegram.block_bot(USER)
    with pytest.raises(error.Forbidden, match=r"^Forbidden: bot was blocked by the user$"):
        await bot.send_message(USER, "blocked for good")
    fake_telegram.open_chat(-77, "group", user_id=USER)
    await bot.send_message(-77, "hello group")
    fake_telegram.migrate_group(-77, -1_001_000_000_077, by_user=USER)
    with pytest.raises(error.ChatMigrated) as migrated:
        await bot.send_message(-77, "hello again")
    assert migrated.value.new_chat_id == -1_001_000_000_077
    moved = await bot.send_message(migrated.value.new_chat_id, "hello supergroup")
    assert moved.chat.type == "supergroup" and moved.chat.title == "Chat -77"
    # The service messages Telegram shows (and sends the bot) in both chats.
    assert fake_telegram.messages(-77)[-1]["migrate_to_chat_id"] == -1_001_000_000_077
    assert fake_telegram.messages(-1_001_000_000_077)[0]["migrate_from_chat_id"] == -77
    fake_telegram.kick_bot(-1_001_000_000_077)
    with pytest.raises(error.Forbidden, match="kicked from the supergroup chat"):
        await bot.send_message(-1_001_000_000_077, "still here?")


async def test_rate_limit_without_retries_raises_retry_after(
    fake_telegram: fake.FakeTelegram,
) -> None:
    application = (
        Application.builder()
        .token(fake_telegram.token)
        .base_url(fake_telegram.base_url)
        .base_file_url(fake_telegram.base_file_url)
        .build()
    )
    fake_telegram.user_sends(USER, "hi")
    async with application:
        fake_telegram.rate_limit_next(1, retry_after=3)
        with pytest.raises(error.RetryAfter) as raised:
            await application.bot.send_message(USER, "too fast")
        assert raised.value.retry_after == dt.timedelta(seconds=3)
        assert (await application.bot.send_message(USER, "later")).text == "later"


async def test_commands_documents_videos_and_chat_actions(
    fake_telegram: fake.FakeTelegram,
) -> None:
    application = (
        Application.builder()
        .token(fake_telegram.token)
        .base_url(fake_telegram.base_url)
        .base_file_url(fake_telegram.base_file_url)
        .build()
    )
    fake_telegram.user_sends(USER, "hi")
    async with application:
        bot = application.bot
        assert await bot.set_my_commands([("f", "Flux Schnell"), ("help", "What I can do")])
        assert [c.command for c in await bot.get_my_commands()] == ["f", "help"]
        with pytest.raises(error.BadRequest, match=r"(?i)bot_command_invalid"):
            await bot.set_my_commands([("Bad-Name", "x")])

        original = png(3000, 2000)
        document = await bot.send_document(USER, original, filename="full.png")
        assert document.document is not None
        assert document.document.file_name == "full.png"
        downloaded = await (await bot.get_file(document.document.file_id)).download_as_bytearray()
        assert bytes(downloaded) == original  # documents are not recompressed

        video = await bot.send_video(
            USER, b"\x00\x00\x00\x18ftypmp42", filename="clip.mp4", width=832, height=480
        )
        assert video.video is not None and video.video.width == 832
        assert await bot.send_chat_action(USER, "upload_photo")
        assert fake_telegram.chat_actions == [(USER, "upload_photo")]

        animation = await bot.send_animation(USER, b"GIF89a" + b"\x00" * 20, filename="a.gif")
        assert animation.animation is not None and animation.document is not None
        status = await bot.send_photo(USER, png(32, 32))
        replaced = await bot.edit_message_media(
            InputMediaPhoto(png(200, 100), caption="final"), USER, status.message_id
        )
        assert isinstance(replaced, Message)
        assert (replaced.photo[-1].width, replaced.caption) == (200, "final")
        assert fake_telegram.bot_messages(USER)[-1]["photo"][-1]["width"] == 200

        user_doc = fake_telegram.user_sends(
            USER, document=(b"%PDF-1.7", "a.pdf", "application/pdf")
        )
        got = await bot.get_file(user_doc["document"]["file_id"])
        assert bytes(await got.download_as_bytearray()) == b"%PDF-1.7"


async def test_get_updates_offsets_confirm_and_long_poll_waits(
    fake_telegram: fake.FakeTelegram,
) -> None:
    application = (
        Application.builder()
        .token(fake_telegram.token)
        .base_url(fake_telegram.base_url)
        .base_file_url(fake_telegram.base_file_url)
        .build()
    )
    async with application:
        bot = application.bot
        fake_telegram.user_sends(USER, "one")
        fake_telegram.user_sends(USER, "two")
        first = await bot.get_updates(timeout=0)
        assert [u.message.text for u in first if u.message] == ["one", "two"]
        again = await bot.get_updates(offset=first[0].update_id, timeout=0)
        assert [u.update_id for u in again] == [u.update_id for u in first]
        assert await bot.get_updates(offset=first[-1].update_id + 1, timeout=0) == ()

        loop = asyncio.get_running_loop()
        started = loop.time()
        waiting = asyncio.create_task(bot.get_updates(offset=first[-1].update_id + 1, timeout=2))
        await asyncio.sleep(0.2)
        fake_telegram.user_sends(USER, "three")
        late = await waiting
        assert [u.message.text for u in late if u.message] == ["three"]
        assert 0.2 <= loop.time() - started < 1.5
