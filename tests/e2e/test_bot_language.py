"""Languages through the fake Bot API: the command menu per language, the user's language
from Telegram, overridden in /settings."""

from __future__ import annotations

import json

from comfyveil import i18n
from tests.e2e.bot_support import running_bot
from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.telegram import FakeTelegram


def _menu(fake: FakeTelegram, language: str = "") -> dict[str, str]:
    key = json.dumps([{"type": "default"}, language], sort_keys=True)
    return {c["command"]: c["description"] for c in fake.commands.get(key, [])}


async def test_the_menu_is_published_in_every_shipped_language(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]):
        default = _menu(fake_telegram)
        assert default["help"] == "What I can do" and default["f"] == "Flux Schnell"
        expected = {
            "ru": "Что я умею",
            "fa": "کارهایی که می‌توانم انجام دهم",
            "zh": "我能做什么",
            "ar": "ما يمكنني فعله",
            "tr": "Neler yapabilirim",
            "es": "Lo que puedo hacer",
        }
        for language, help_text in expected.items():
            menu = _menu(fake_telegram, language)
            assert menu["help"] == help_text, language
            assert set(menu) == set(default)
        assert set(expected) | {"en"} == set(i18n.LANGUAGES)
        # Shipped workflows' titles come from the catalogs; product names stay.
        assert _menu(fake_telegram, "ru")["wan"] == "Wan 2.2 14B: текст в видео"
        assert _menu(fake_telegram, "ru")["f"] == "Flux Schnell"


async def test_the_language_comes_from_telegram_and_settings_override_it(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(90, "/settings", language_code="fa")
        call = await fake_telegram.wait_for_call("sendMessage", chat_id=90)
        assert (await db.users.settings(90)).get("tg_language") == "fa"
        keyboard = call.result["reply_markup"]["inline_keyboard"]
        labels = {b["text"].removeprefix("✓ "): b["callback_data"] for r in keyboard for b in r}
        # The Persian app's user reads /settings in Persian, "auto" chosen.
        assert "✓ زبان خودکار" in [b["text"] for r in keyboard for b in r]
        assert "زبان: خودکار (فارسی)" in call.result["text"]
        query = fake_telegram.user_presses(90, call.result["message_id"], labels["Español"])
        await fake_telegram.wait_for(lambda _: query in fake_telegram.callback_answers)
        settings = await db.users.settings(90)
        assert settings.get("language") == "es" and settings.get("tg_language") == "fa"
        # The answer and the settings message speak the new language at once.
        assert fake_telegram.callback_answers[query].get("text") == "Guardado."
        shown = next(m for m in fake_telegram.bot_messages(90)
                     if m["message_id"] == call.result["message_id"])
        assert "Idioma: Español" in shown["text"]
        stack.send(90, "/history", language_code="fa")
        assert await stack.reply_text(90, count=2) == "Todavía no tienes trabajos."
        query = fake_telegram.user_presses(90, call.result["message_id"], labels["زبان خودکار"])
        await fake_telegram.wait_for(lambda _: query in fake_telegram.callback_answers)
        assert "language" not in await db.users.settings(90)
