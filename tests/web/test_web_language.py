"""The web pages in the reader's language: the account's choice (the chat's settings
key), else the browser's Accept-Language, else English; right-to-left pages say so."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from comfyveil.desk import language
from tests.web.support import client, csrf_of, get_text, sign_up, web_stack

DATA = Path(__file__).parents[1] / "data"
PERSIAN_LOGIN = "ورود"  # "Log in"
PERSIAN_SETTINGS = "تنظیمات"  # "Settings"


def test_accept_language_picks_the_best_shipped_language() -> None:
    assert language.from_accept_language(None) == "en"
    assert language.from_accept_language("de-DE,de;q=0.9") == "en"
    assert language.from_accept_language("de-DE,fa-IR;q=0.8,ru;q=0.5") == "fa"
    assert language.from_accept_language("ru;q=0.3, es;q=0.7") == "es"
    assert language.from_accept_language("zh-CN, ar") == "zh"
    assert language.from_accept_language("fa;q=0, tr;q=0.1") == "tr"
    assert language.choose({"language": "ar"}, "fa") == "ar"
    assert language.choose({"language": ""}, "fa") == "fa"


async def test_login_page_is_english_by_default_and_persian_when_the_browser_asks(
    db, fake_comfy
) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        _, page = await get_text(session, stack.url + "/login")
        assert '<html lang="en" dir="ltr">' in page
        assert "<h1>Log in</h1>" in page and PERSIAN_LOGIN not in page
        headers = {"Accept-Language": "de-DE,fa-IR;q=0.9,en;q=0.5"}
        async with session.get(stack.url + "/login", headers=headers) as response:
            page = await response.text()
        assert '<html lang="fa" dir="rtl">' in page
        assert f"<h1>{PERSIAN_LOGIN}</h1>" in page
        assert "Accounts are by invitation only" not in page
        async with session.get(stack.url + "/no/such/page", headers=headers) as response:
            assert response.status == 404
            assert "اینجا چیزی نیست." in await response.text()
        # A refusal raised in the Python code is in the page's language too.
        async with session.post(
            stack.url + "/login",
            data={"csrf": csrf_of(page), "name": "nobody", "passphrase": "wrong passphrase"},
            headers=headers,
        ) as response:
            assert response.status == 403
            assert "نام یا عبارت عبور نادرست است،" in await response.text()


async def test_the_accounts_language_choice_wins_and_is_the_chats_setting(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        await sign_up(session, await stack.invite(), "parisa")
        _, page = await get_text(session, stack.url + "/settings")
        assert '<html lang="en" dir="ltr">' in page
        assert '<select id="f-language" name="language">' in page
        assert '<label for="f-language">Language</label>' in page
        assert ">فارسی</option>" in page and ">简体中文</option>" in page
        async with session.post(
            stack.url + "/settings",
            data={"csrf": csrf_of(page), "steps": "", "seed": "", "language": "fa"},
        ) as response:
            saved = await response.text()
            assert response.status == 200, saved
        assert '<html lang="fa" dir="rtl">' in saved, "the confirmation is already in Persian"
        account = await stack.store.account_by_name("parisa")
        assert account is not None
        settings = await db.users.settings(account.user_id)
        assert settings["language"] == "fa", "the key the chat's /settings uses"
        # Another page, a browser asking for Spanish: the account's choice wins.
        async with session.get(
            stack.url + "/settings", headers={"Accept-Language": "es"}
        ) as response:
            page = await response.text()
        assert '<html lang="fa" dir="rtl">' in page
        assert f"<h1>{PERSIAN_SETTINGS}</h1>" in page
        assert '<option value="fa" lang="fa" selected>' in page
        # Back to automatic: the browser's language again.
        async with session.post(
            stack.url + "/settings",
            data={"csrf": csrf_of(page), "steps": "", "seed": "", "language": ""},
            headers={"Accept-Language": "es"},
        ) as response:
            page = await response.text()
        assert '<html lang="es" dir="ltr">' in page and "<h1>Ajustes</h1>" in page
        assert "language" not in await db.users.settings(account.user_id)


async def test_admin_pages_and_form_labels_in_the_admins_language(db, fake_comfy) -> None:
    """The admin pages, their plurals and the form labels of the shipped workflows follow
    the reader's language like every other page."""
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        await sign_up(session, await stack.invite(admin=True), "olga")
        async with client() as other:
            await sign_up(other, await stack.invite(), "pat")
        _, page = await get_text(session, stack.url + "/admin")
        assert "<p>2 web accounts. 0 jobs waiting in the queue.</p>" in page
        async with session.post(
            stack.url + "/settings",
            data={"csrf": csrf_of(page), "steps": "", "seed": "", "language": "ru"},
        ) as response:
            assert response.status == 200
        _, page = await get_text(session, stack.url + "/admin")
        assert '<html lang="ru" dir="ltr">' in page and "<h1>Администрирование</h1>" in page
        assert "2 веб-учётные записи." in page and "В очереди 0 заданий." in page
        assert 'href="/admin/users">Пользователи</a>' in page
        _, users = await get_text(session, stack.url + "/admin/users")
        pat = await stack.store.account_by_name("pat")
        assert pat is not None
        assert "Заблокировать <bdi>pat</bdi>" in users and "Ban" not in users
        async with session.post(
            stack.url + "/admin/users/quota",
            data={"csrf": csrf_of(users), "account": str(pat.id), "quota": "3"},
        ) as response:
            assert "Квота установлена." in await response.text()
        _, form = await get_text(session, stack.url + "/c/f")
        assert '<label for="f-steps">Шаги</label>' in form
        _, qwen = await get_text(session, stack.url + "/c/qwen")
        assert '<label for="f-negative">Негативный промпт</label>' in qwen


async def test_an_operators_workflow_brings_its_own_translated_labels(db, fake_comfy) -> None:
    """A workflow added from the admin page with ``label.fa`` and ``description.fa`` shows
    them to a Persian reader; an English one reads the defaults."""
    toml = (DATA / "noise_copy.toml").read_text().replace(
        'description = "the image to copy"\n',
        'description.default = "the image to copy"\ndescription.fa = "تصویری برای رونوشت"\n'
        'label.default = "Source picture"\nlabel.fa = "تصویر مبدأ"\n',
    )
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as admin:
        await sign_up(admin, await stack.invite(admin=True), "dara")
        _, page = await get_text(admin, stack.url + "/admin/workflows")
        form = aiohttp.FormData()
        form.add_field("csrf", csrf_of(page))
        form.add_field("toml", toml.encode(), filename="noise_copy.toml")
        form.add_field("graph", (DATA / "noise_copy.json").read_bytes(), filename="noise_copy.json")
        form.add_field("enable", "yes")
        async with admin.post(stack.url + "/admin/workflows/add", data=form) as response:
            assert response.status == 200, await response.text()
        _, english = await get_text(admin, stack.url + "/c/copy")
        assert "<legend>Source picture (required)</legend>" in english
        assert "the image to copy" in english
        async with admin.get(
            stack.url + "/c/copy", headers={"Accept-Language": "fa"}
        ) as response:
            persian = await response.text()
        assert "<legend>تصویر مبدأ" in persian and "تصویری برای رونوشت" in persian
        assert "Source picture" not in persian


def _template_texts() -> dict[str, str]:
    """The page templates' English texts long enough to spot (msgid -> msgid)."""
    from comfyveil.locale import catalogs

    found = {}
    for message in catalogs.extract():
        if not isinstance(message.id, str) or "%(" in message.id or len(message.id) < 5:
            continue
        if any("/templates/" in path for path, _line in message.locations):
            found[message.id] = message.id
    return found


async def test_no_english_is_left_on_any_page_in_any_language(db, fake_comfy) -> None:
    """Every page a signed-in admin can open, in each shipped language: no text of the
    templates shows in English unless the language keeps it so on purpose (a product
    name, NAME.toml)."""
    import html
    import re
    import uuid

    from comfyveil import i18n
    from tests.web.test_web_jobs import JOB_URL, finished, submit_form

    english = _template_texts()
    assert len(english) > 50
    async with web_stack(db, [fake_comfy]) as stack, client() as session:
        await sign_up(session, await stack.invite(admin=True), "nour")
        response = await submit_form(
            session, stack.url, "f", {"prompt": "a fox", "width": "256", "height": "256"}
        )
        job_id = uuid.UUID(JOB_URL.search(str(response.url)).group(1))  # type: ignore[union-attr]
        await finished(stack, job_id)
        pages = ["/", "/history", "/gallery", "/settings", "/c/f", "/c/qwen", f"/jobs/{job_id}",
                 "/forget", "/admin", "/admin/users", "/admin/invites", "/admin/backends",
                 "/admin/workflows"]
        for language in i18n.LANGUAGES:
            if language == i18n.DEFAULT:
                continue
            with i18n.using(language):
                kept = {text for text in english if i18n._(text) == text}
            _, page = await get_text(session, stack.url + "/settings")
            async with session.post(
                stack.url + "/settings",
                data={"csrf": csrf_of(page), "steps": "", "seed": "", "language": language},
            ) as response:
                assert response.status == 200
            for path in pages:
                status, page = await get_text(session, stack.url + path)
                assert status == 200, (language, path)
                assert f'<html lang="{language}"' in page, (language, path)
                shown = html.unescape(re.sub(r"<[^>]+>", " ", page))
                left = [
                    text for text in english
                    if text not in kept
                    and re.search(rf"(?<!\w){re.escape(text)}(?!\w)", shown)
                ]
                assert not left, (language, path, left)
