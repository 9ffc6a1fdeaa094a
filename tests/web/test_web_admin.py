"""Admin pages: users (quotas, bans, admin rights), invitations, backends, workflows."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp

from tests.integration.heartbeat_support import beating
from tests.web.support import client, csrf_of, get_text, sign_up, wait_for, web_stack
from tests.web.test_web_jobs import submit_form

DATA = Path(__file__).parents[1] / "data"


async def _admin_and_user(stack, admin: aiohttp.ClientSession, user: aiohttp.ClientSession):
    await sign_up(admin, await stack.invite(admin=True), "boss")
    await sign_up(user, await stack.invite(), "pat")
    account = await stack.store.account_by_name("pat")
    assert account is not None
    return account


async def test_admin_pages_are_only_for_admins(db, fake_comfy) -> None:
    async with (
        web_stack(db, [fake_comfy], worker=False) as stack,
        client() as admin,
        client() as user,
    ):
        await _admin_and_user(stack, admin, user)
        for path in (
            "/admin",
            "/admin/users",
            "/admin/invites",
            "/admin/backends",
            "/admin/workflows",
        ):
            status, _ = await get_text(admin, stack.url + path)
            assert status == 200, path
            status, _ = await get_text(user, stack.url + path)
            assert status == 404, path
        _, home = await get_text(user, stack.url + "/")
        async with user.post(
            stack.url + "/admin/users/quota",
            data={"csrf": csrf_of(home), "account": "1", "quota": "0"},
        ) as r:
            assert r.status == 404


async def test_quota_and_ban_from_the_users_page(db, fake_comfy) -> None:
    async with (
        web_stack(db, [fake_comfy], worker=False) as stack,
        client() as admin,
        client() as user,
    ):
        pat = await _admin_and_user(stack, admin, user)
        _, page = await get_text(admin, stack.url + "/admin/users")
        # What would be refused is not offered: no Ban or Revoke admin on one's own row.
        rows = re.findall(r"<tr>.*?</tr>", page, flags=re.S)
        own = next(row for row in rows if "<bdi>boss</bdi>" in row)
        other = next(row for row in rows if "<bdi>pat</bdi>" in row)
        assert "/admin/users/ban" not in own and "/admin/users/revoke-admin" not in own
        assert "/admin/users/ban" in other and "/admin/users/make-admin" in other
        async with admin.post(
            stack.url + "/admin/users/quota",
            data={"csrf": csrf_of(page), "account": str(pat.id), "quota": "0"},
        ) as r:
            assert "The quota was set." in await r.text()
        assert (await stack.db.users.get(pat.user_id)).daily_quota == 0  # type: ignore[union-attr]
        response = await submit_form(
            user, stack.url, "f", {"prompt": "a fox", "width": "256", "height": "256"}
        )
        text = await response.text()
        assert response.status == 400 and "daily" in text.lower()
        assert await stack.job_count() == 0
        async with admin.post(
            stack.url + "/admin/users/ban", data={"csrf": csrf_of(page), "account": str(pat.id)}
        ) as r:
            assert r.status == 200
        async with user.get(stack.url + "/", allow_redirects=False) as r:
            assert r.status == 303, "the banned account's session ended"
        assert (await stack.db.users.get(pat.user_id)).role == "banned"  # type: ignore[union-attr]
        _, login = await get_text(user, stack.url + "/login")
        async with user.post(
            stack.url + "/login",
            data={
                "csrf": csrf_of(login),
                "name": "pat",
                "passphrase": "correct horse battery staple",
            },
        ) as r:
            # the answer of a wrong passphrase: a ban must not confirm a guessed one
            assert r.status == 403 and "Wrong name or passphrase" in await r.text()


async def test_invitations_from_the_admin_page(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as admin:
        await sign_up(admin, await stack.invite(admin=True), "boss")
        _, page = await get_text(admin, stack.url + "/admin/invites")
        async with admin.post(stack.url + "/admin/invites", data={"csrf": csrf_of(page)}) as r:
            text = await r.text()
        link = text.split('id="f-link" value="', 1)[1].split('"', 1)[0]
        assert link.startswith(stack.url + "/invite/")
        async with client() as newcomer:
            home = await sign_up(newcomer, link, "newbie")
            assert "Log out (newbie)" in home and 'href="/admin"' not in home


async def test_backends_page_names_missing_models(db, fake_comfy_factory) -> None:
    comfy = await fake_comfy_factory(models={"checkpoints": []})
    async with web_stack(db, [comfy], worker=False) as stack, client() as admin:
        await sign_up(admin, await stack.invite(admin=True), "boss")

        async def probed() -> bool:
            _, page = await get_text(admin, stack.url + "/admin/backends")
            return "is not installed" in page

        await wait_for(probed)
        await beating(db, "gpu-host-1", running=1)
        await beating(db, "old-host", gone=True)
        _, page = await get_text(admin, stack.url + "/admin/backends")
        assert "gpu0" in page and "flux1-schnell.safetensors" in page
        assert "<bdi>gpu-host-1</bdi>" in page and "<bdi>old-host</bdi>" in page
        workers = page[page.index("<h2>Workers</h2>"):]
        assert workers.index("gpu-host-1") < workers.index(">alive<") < workers.index("old-host")
        assert ">gone<" in workers and "1 job running" in workers
        # and the one command that installs them on the GPU host
        assert "<code dir=\"ltr\">comfyveil models install f --comfyui-dir DIR</code>" in page


async def test_workflows_enable_disable_and_add_from_uploads(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as admin:
        await sign_up(admin, await stack.invite(admin=True), "boss")
        _, page = await get_text(admin, stack.url + "/admin/workflows")
        async with admin.post(
            stack.url + "/admin/workflows/disable", data={"csrf": csrf_of(page), "command": "sd3"}
        ) as r:
            assert r.status == 200
        status, _ = await get_text(admin, stack.url + "/c/sd3")
        assert status == 404
        _, home = await get_text(admin, stack.url + "/")
        assert 'href="/c/sd3"' not in home
        form = aiohttp.FormData()
        form.add_field("csrf", csrf_of(page))
        form.add_field("toml", (DATA / "noise_copy.toml").read_bytes(), filename="noise_copy.toml")
        form.add_field("graph", (DATA / "noise_copy.json").read_bytes(), filename="noise_copy.json")
        form.add_field("enable", "yes")
        async with admin.post(stack.url + "/admin/workflows/add", data=form) as r:
            assert "/copy was added." in await r.text()
        status, page = await get_text(admin, stack.url + "/c/copy")
        assert status == 200 and 'type="file" id="f-image"' in page
        bad = aiohttp.FormData()
        bad.add_field("csrf", csrf_of(page))
        bad.add_field("toml", b'command = "x"\n', filename="x.toml")
        bad.add_field("graph", b"{}", filename="x.json")
        async with admin.post(stack.url + "/admin/workflows/add", data=bad) as r:
            text = await r.text()
            assert r.status == 400 and 'class="problem"' in text
            # the error comes before the long table of commands, where it is seen
            assert text.index('class="problem"') < text.index("<table>")


async def test_a_command_switched_off_elsewhere_leaves_the_site_at_once(db, fake_comfy) -> None:
    """`comfyveil workflows disable sd3` in another process: the site hears it by NOTIFY,
    not at its registry's next re-read 30 s later (issue 23 rough)."""

    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        await sign_up(session, await stack.invite(), "kim")
        status, _ = await get_text(session, stack.url + "/c/sd3")
        assert status == 200
        await stack.db.commands.set_enabled("sd3", False)

        async def gone() -> bool:
            status, _ = await get_text(session, stack.url + "/c/sd3")
            return status == 404

        await wait_for(gone, timeout=10)  # well inside the 30 s re-read


async def test_users_page_counts_todays_jobs_as_the_quota_does_and_says_admins_have_no_limits(
    db, fake_comfy
) -> None:
    """Today's count is the quota's (a refunded failure is not in it: issue 23 item 6), and
    an admin's row says admin and no limits instead of a quota (item 9)."""
    from comfyveil.store import jobs as jobs_store

    async with (
        web_stack(db, [fake_comfy], worker=False) as stack,
        client() as admin,
        client() as user,
    ):
        pat = await _admin_and_user(stack, admin, user)
        made = []
        for n in range(3):
            made.append(await stack.db.jobs.enqueue(
                jobs_store.NewJob(user_id=pat.user_id, chat_id=pat.chat_id, command="f",
                                  workflow_hash="h" * 64, params={"prompt": f"fox {n}"}),
                daily_quota=4))
        async with stack.db.pool.connection() as conn:
            await conn.execute("UPDATE jobs SET status = 'failed', finished_at = now() "
                               "WHERE id = %(id)s", {"id": made[0].id})
        await stack.db.jobs.refund_quota(made[0].id)  # failed before the GPU: refunded already
        assert await stack.db.users.quota_used_today(pat.user_id) == 2
        _, page = await get_text(admin, stack.url + "/admin/users")
        rows = re.findall(r"<tr>.*?</tr>", page, flags=re.S)
        pat_row = next(row for row in rows if "<bdi>pat</bdi>" in row)
        cells = re.findall(r"<td>(.*?)</td>", pat_row, flags=re.S)
        assert cells[2].strip() == "2", cells  # 3 queued, 1 given back
        boss_row = next(row for row in rows if "<bdi>boss</bdi>" in row)
        cells = re.findall(r"<td>(.*?)</td>", boss_row, flags=re.S)
        assert cells[1].strip() == "admin" and "No limits" in boss_row, cells
