"""/web in the chat: a one-time link that links a web account to the Telegram user, so
the chat and the web show one history."""

from __future__ import annotations

import re
import uuid

from comfyveil import config
from tests.e2e.bot_support import SMALL, running_bot
from tests.fakes.telegram import FakeTelegram
from tests.web.support import (
    PASSPHRASE,
    client,
    csrf_of,
    get_text,
    sign_up,
    wait_for,
    web_stack,
)
from tests.web.test_web_jobs import JOB_URL, finished, submit_form

LINK = re.compile(r"(http://\S+/link/([A-Za-z0-9_-]+))")
TG_USER = 7001
# The bot of these tests is open (running_bot's default); the web follows the same rule.
OPEN = config.TelegramConfig(open=True)


async def _chat_text(bot, chat: int, pattern: str) -> str:
    """The first bot message in `chat` that matches `pattern`, waiting for it."""

    async def seen() -> bool:
        return any(re.search(pattern, m.get("text", "")) for m in bot.telegram.bot_messages(chat))

    await wait_for(seen, timeout=15)
    return next(
        m["text"] for m in bot.telegram.bot_messages(chat) if re.search(pattern, m.get("text", ""))
    )


async def _web_link(bot, user: int = TG_USER) -> str:
    before = {m.get("text") for m in bot.telegram.bot_messages(user)}
    bot.send(user, "/web")

    async def fresh() -> bool:
        return any(
            LINK.search(m.get("text", "")) and m.get("text") not in before
            for m in bot.telegram.bot_messages(user)
        )

    await wait_for(fresh, timeout=15)
    text = next(
        m["text"]
        for m in bot.telegram.bot_messages(user)
        if LINK.search(m.get("text", "")) and m.get("text") not in before
    )
    found = LINK.search(text)
    assert found, text
    return found.group(2)


async def test_web_link_creates_an_account_with_one_history(
    fake_telegram: FakeTelegram, db, fake_comfy
) -> None:
    async with (
        running_bot(fake_telegram, db, [fake_comfy]) as bot,
        web_stack(db, [fake_comfy], worker=False, telegram=OPEN) as stack,
        client() as session,
    ):
        bot.send(TG_USER, f"/f a chat fox {SMALL}")
        await bot.result(TG_USER)
        token = await _web_link(bot)
        url = f"{stack.url}/link/{token}"
        status, page = await get_text(session, url)  # what a link preview would fetch
        assert status == 200 and 'value="signup"' in page
        status, page = await get_text(session, url)
        assert status == 200, "opening the link changed nothing"
        async with session.post(
            url,
            data={
                "csrf": csrf_of(page),
                "action": "signup",
                "name": "tgfox",
                "passphrase": "correct horse battery staple",
                "again": "correct horse battery staple",
            },
        ) as response:
            home = await response.text()
        assert "Log out (tgfox)" in home
        account = await stack.store.account_by_name("tgfox")
        assert account is not None and account.user_id == TG_USER
        _, history = await get_text(session, stack.url + "/history")
        assert "a chat fox" in history
        status, _ = await get_text(session, url)
        assert status == 404, "the link works once"
        # A job from the web shows in the chat's /history
        response = await submit_form(
            session, stack.url, "f", {"prompt": "a web fox", "width": "256", "height": "256"}
        )
        job_id = uuid.UUID(JOB_URL.search(str(response.url)).group(1))  # type: ignore[union-attr]
        job = await stack.db.jobs.get(job_id)
        assert job is not None and job.user_id == TG_USER
        bot.send(TG_USER, "/history")
        await _chat_text(bot, TG_USER, "a web fox")


CODE = re.compile(r"/web (\d+-[A-Z2-7]{8})")


async def test_linking_starts_on_the_web_and_logging_in_from_a_link_asks_the_passphrase(
    fake_telegram: FakeTelegram, db, fake_comfy
) -> None:
    async with (
        running_bot(fake_telegram, db, [fake_comfy]) as bot,
        web_stack(db, [fake_comfy], telegram=OPEN) as stack,
    ):
        async with client() as session:
            await sign_up(session, await stack.invite(), "webby")
            response = await submit_form(
                session,
                stack.url,
                "f",
                {"prompt": "an early web owl", "width": "256", "height": "256"},
            )
            early = uuid.UUID(JOB_URL.search(str(response.url)).group(1))  # type: ignore[union-attr]
            await finished(stack, early)
            # Settings shows a short code; the owner sends it from her own Telegram
            _, settings = await get_text(session, stack.url + "/settings")
            found = CODE.search(settings)
            assert found, "the settings page shows the code to send"
            bot.send(TG_USER, f"/web {found.group(1)}")
            await _chat_text(bot, TG_USER, "linked to the web account webby")
            moved = await stack.db.jobs.get(early)
            assert moved is not None and moved.user_id == TG_USER
            async with stack.db.pool.connection() as conn:  # one quota for both now
                cur = await conn.execute("SELECT user_id, jobs_today FROM user_usage")
                usage = {row["user_id"]: row["jobs_today"] for row in await cur.fetchall()}
            assert usage == {TG_USER: 1}

            # The bot heard the web job end and took it as delivered, sending nothing to a
            # chat that does not exist
            async def delivered() -> bool:
                async with stack.db.pool.connection() as conn:
                    cur = await conn.execute(
                        "SELECT 1 FROM deliveries WHERE job_id = %s AND sink = 'telegram'",
                        (early,),
                    )
                    return await cur.fetchone() is not None

            await wait_for(delivered)
            assert not bot.telegram.calls("sendPhoto")
            assert not [c for c in bot.telegram.calls(ok=False) if c.method != "getUpdates"]
            async with session.get(f"{stack.url}/jobs/{early}/out/0") as r:
                assert r.status == 200, "the owner still sees the result"
            # the code works once: another Telegram user cannot take the account with it
            bot.send(7009, f"/web {found.group(1)}")
            await _chat_text(bot, 7009, "not valid")
        bot.send(TG_USER, "/history")
        await _chat_text(bot, TG_USER, "an early web owl")
        # Later, a new link logs into the linked account from a fresh browser, with the
        # account's passphrase and only with it
        token = await _web_link(bot)
        async with client() as fresh:
            _, page = await get_text(fresh, f"{stack.url}/link/{token}")
            assert "webby" in page and 'name="passphrase"' in page
            async with fresh.post(
                f"{stack.url}/link/{token}", data={"csrf": csrf_of(page), "action": "login"}
            ) as r:
                assert r.status == 403 and "Log out" not in await r.text()
            async with fresh.post(
                f"{stack.url}/link/{token}",
                data={"csrf": csrf_of(page), "action": "login", "passphrase": PASSPHRASE},
            ) as r:
                assert "Log out (webby)" in await r.text()


async def test_an_attackers_link_cannot_take_over_a_signed_in_account(
    fake_telegram: FakeTelegram, db, fake_comfy
) -> None:
    """Issue 22 §2: the attacker sends /web for his own Telegram id and gets the victim,
    signed in on the web, to open the link and press its button."""
    attacker = 7666
    async with (
        running_bot(fake_telegram, db, [fake_comfy]) as bot,
        web_stack(db, [fake_comfy], worker=False, telegram=OPEN) as stack,
        client() as victim,
    ):
        await sign_up(victim, await stack.invite(admin=True), "victim")
        token = await _web_link(bot, attacker)
        _, page = await get_text(victim, f"{stack.url}/link/{token}")
        assert 'value="link"' not in page
        async with victim.post(
            f"{stack.url}/link/{token}", data={"csrf": csrf_of(page), "action": "link"}
        ) as r:
            await r.read()
        account = await stack.store.account_by_name("victim")
        assert account is not None and account.user_id != attacker
        # and the attacker's next /web offers him no way into her account
        token = await _web_link(bot, attacker)
        async with client() as fresh:
            _, page = await get_text(fresh, f"{stack.url}/link/{token}")
            assert "victim" not in page


async def test_web_is_refused_in_groups(fake_telegram: FakeTelegram, db, fake_comfy) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as bot:
        bot.send(TG_USER, "/web", chat_id=-100123, chat_type="supergroup")
        await _chat_text(bot, -100123, "private chat")
