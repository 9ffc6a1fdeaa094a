"""Each shipped language in the chat, through the fake Bot API: /help, a refusal with a
plural, a status message; Persian and Arabic keep commands and numbers left to right."""

from __future__ import annotations

import pytest

from comfyveil import config
from tests.e2e.bot_support import SMALL, running_bot
from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.telegram import FakeTelegram

LRI, PDI = "\u2066", "\u2069"

# What a user reads, written out by hand (not computed from the catalogs under test).
HELP = {
    "en": "What I can do",
    "ru": "Что я умею",
    "fa": "کارهایی که می‌توانم انجام دهم",
    "zh": "我能做什么",
    "ar": "ما يمكنني فعله",
    "tr": "Neler yapabilirim",
    "es": "Lo que puedo hacer",
}
# Two jobs waiting, a third refused: "2" takes Russian's "few" form and Arabic's dual.
REFUSAL = {
    "en": "You already have 2 jobs waiting or running; wait for one to finish or cancel one.",
    "ru": "У вас уже 2 задания в очереди или в работе; дождитесь окончания одного или "
          "отмените одно.",
    "fa": f"شما همین حالا {LRI}2{PDI} کار در صف یا در حال اجرا دارید؛ صبر کنید یکی تمام شود "
          "یا یکی را لغو کنید.",
    "zh": "您已有 2 个任务在排队或运行；请等待完成或取消一个。",
    "ar": "لديك بالفعل مهمتان منتظرتان أو قيد التشغيل؛ انتظر انتهاء إحداهما أو ألغِ واحدة.",
    "tr": "Zaten bekleyen veya çalışan 2 işiniz var; birinin bitmesini bekleyin ya da birini "
          "iptal edin.",
    "es": "Ya tienes 2 trabajos en espera o en curso; espera a que termine uno o cancela uno.",
}
QUEUED = {
    "en": "Queued",
    "ru": "В очереди",
    "fa": "در صف",
    "zh": "排队中",
    "ar": "في الطابور",
    "tr": "Sırada",
    "es": "En cola",
}


@pytest.mark.parametrize("language", list(HELP))
async def test_help_a_plural_refusal_and_a_status_in_each_language(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db, language: str
) -> None:
    user = 300 + list(HELP).index(language)
    limits = config.LimitsConfig(max_queued=2)
    async with running_bot(fake_telegram, db, [fake_comfy], worker=False,
                           limits=limits) as stack:
        stack.send(user, "/help", language_code=language)
        shown = await stack.reply_text(user)
        assert shown.splitlines()[0] == HELP[language]
        if language in ("fa", "ar"):
            assert f"{LRI}--steps{PDI}" in shown or f"{LRI}<code>--steps" in shown or (
                f"{LRI}--steps" in shown
            )
        stack.send(user, f"/f a fox {SMALL}", language_code=language)
        status = await fake_telegram.wait_for_call("sendMessage", chat_id=user, count=2)
        assert status.result["text"].startswith(QUEUED[language]), status.result["text"]
        stack.send(user, f"/f a cat {SMALL}", language_code=language)
        await fake_telegram.wait_for_call("sendMessage", chat_id=user, count=3)
        stack.send(user, f"/f a dog {SMALL}", language_code=language)
        assert await stack.reply_text(user, count=4) == REFUSAL[language]
        assert await stack.queued_count() == 2
