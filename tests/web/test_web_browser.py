"""The web front end in a real browser with JavaScript disabled: Debian's chromium,
driven by Playwright.

invite -> sign up -> generate (fake ComfyUI) -> progress -> result -> download the
original -> edit it -> cancel a slow job -> history -> forget -> log out; another account
cannot open the first one's images by URL; a POST without the CSRF token is refused.
The run takes screenshots of a form and a result page; `make screenshots` keeps them in
docs/ for the docs site (a plain run keeps them in its temporary folder, so testing never
changes tracked files).
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest

from comfyveil.store import jobs
from tests.web.browser import launch, needs_chromium
from tests.web.support import PASSPHRASE, wait_for, web_stack

pytestmark = [needs_chromium, pytest.mark.slow]

DOCS = Path(__file__).parents[2] / "docs"


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go: docs/ when COMFYVEIL_SCREENSHOTS=docs (make screenshots)."""
    return DOCS if os.environ.get("COMFYVEIL_SCREENSHOTS") == "docs" else tmp_path
TIMEOUT_MS = 30_000


async def _sign_up(page, invite: str, name: str) -> None:
    await page.goto(invite)
    await page.get_by_label("Name").fill(name)
    await page.get_by_label("Passphrase", exact=True).fill(PASSPHRASE)
    await page.get_by_label("Passphrase again").fill(PASSPHRASE)
    await page.get_by_role("button", name="Create account").click()
    await page.wait_for_url(re.compile(r"/$"))


def _job_id(url: str) -> uuid.UUID:
    found = re.search(r"/jobs/([0-9a-f-]{36})$", url)
    assert found, url
    return uuid.UUID(found.group(1))


async def test_the_whole_journey_with_javascript_off(db, fake_comfy_factory, shots) -> None:
    comfy = await fake_comfy_factory(step_delay=0.6)
    async with web_stack(db, [comfy]) as stack, launch() as browser:
        context = await browser.new_context(
            java_script_enabled=False,
            accept_downloads=True,
            viewport={"width": 820, "height": 1000},
        )
        context.set_default_timeout(TIMEOUT_MS)
        page = await context.new_page()

        # invite -> sign up
        await _sign_up(page, await stack.invite(), "alice")
        assert await page.get_by_role("link", name="Flux Schnell").is_visible()

        # generate from the form: every field has its label
        await page.get_by_role("link", name="Flux Schnell").click()
        await page.get_by_label("Prompt").fill("an astronaut riding a horse")
        await page.get_by_label("Steps").fill("4")
        await page.get_by_label("Width").fill("256")
        await page.get_by_label("Height").fill("256")
        await page.screenshot(path=str(shots / "web-form.png"), full_page=True)
        await page.get_by_role("button", name="Generate").click()
        await page.wait_for_url(re.compile(r"/jobs/"))
        first = _job_id(page.url)

        # progress: the page refreshes itself (meta refresh, no script) until the result
        body = await page.inner_text("main")
        assert re.search(r"Place in the queue|Waiting|Progress|Elapsed|Ready in", body), body
        assert await page.locator('meta[http-equiv="refresh"]').count() == 1
        await page.wait_for_selector("img[alt^='Result 1']", timeout=TIMEOUT_MS)
        assert await page.locator('meta[http-equiv="refresh"]').count() == 0
        await page.screenshot(path=str(shots / "web-result.png"), full_page=True)
        await page.set_viewport_size({"width": 390, "height": 844})  # a phone
        await page.screenshot(path=str(shots / "web-phone.png"))
        await page.set_viewport_size({"width": 820, "height": 1000})

        # download the original: the bytes the GPU made
        async with page.expect_download() as info:
            await page.get_by_role("link", name="Download original").click()
        download = await info.value
        saved = Path(await download.path())
        assert saved.read_bytes() == (await stack.db.jobs.outputs(first))[0].data

        # another account cannot open alice's image by its URL
        other = await browser.new_context(java_script_enabled=False)
        other_page = await other.new_page()
        await _sign_up(other_page, await stack.invite(), "mallory")
        response = await other_page.goto(f"{stack.url}/jobs/{first}/out/0")
        assert response is not None and response.status == 404
        response = await other_page.goto(f"{stack.url}/jobs/{first}")
        assert response is not None and response.status == 404
        await other.close()

        # a POST without the CSRF token is refused, even with alice's session cookie
        refused = await context.request.post(
            f"{stack.url}/c/f", form={"prompt": "forged", "nonce": "x1"}
        )
        assert refused.status == 403
        assert await stack.job_count() == 1

        # edit it: the edit form comes with this result chosen
        await page.get_by_role("link", name="Edit this with /qwen").click()
        chosen = page.get_by_label("or use one of my results")
        assert await chosen.input_value() == f"{first}:0"
        await page.get_by_label(re.compile(r"^Prompt")).fill("put a red hat on him")
        await page.get_by_label("Steps").fill("1")
        await page.get_by_label("Megapixels").fill("0.25")
        await page.get_by_role("button", name="Generate").click()
        await page.wait_for_url(re.compile(r"/jobs/"))
        edit = _job_id(page.url)
        await page.wait_for_selector("img[alt^='Result 1']", timeout=TIMEOUT_MS)
        assert (await stack.db.jobs.get(edit)).status is jobs.Status.SUCCEEDED  # type: ignore[union-attr]

        # cancel a slow job
        comfy.step_delay = 2.0
        await page.goto(f"{stack.url}/c/f")
        await page.get_by_label("Prompt").fill("a very slow fox")
        await page.get_by_label("Steps").fill("8")
        await page.get_by_label("Width").fill("256")
        await page.get_by_label("Height").fill("256")
        await page.get_by_role("button", name="Generate").click()
        await page.wait_for_url(re.compile(r"/jobs/"))
        slow = _job_id(page.url)

        async def running() -> bool:
            job = await stack.db.jobs.get(slow)
            return job is not None and job.status is jobs.Status.RUNNING

        await wait_for(running)
        await page.reload()
        await page.get_by_role("button", name="Cancel").click()
        await page.wait_for_selector("text=Cancelled.", timeout=TIMEOUT_MS)
        assert comfy.interrupts

        # history lists all three
        await page.get_by_role("link", name="History").click()
        rows = page.locator("tbody tr")
        assert await rows.count() == 3
        await page.get_by_role("link", name="Gallery").click()
        assert await page.locator(".gallery img").count() == 2

        # forget, after a confirmation
        await page.get_by_role("link", name="Settings").click()
        await page.get_by_role("link", name="Delete everything stored about me").click()
        await page.get_by_label("Yes, delete it all").check()
        await page.get_by_role("button", name="Delete").click()
        await page.wait_for_selector("text=Everything stored about you was deleted.")

        async def forgotten() -> bool:
            return await stack.job_count() == 0

        await wait_for(forgotten)

        # log out
        await page.get_by_role("button", name=re.compile("Log out")).click()
        await page.wait_for_url(re.compile(r"/login$"))
        response = await page.goto(f"{stack.url}/history")
        assert response is not None and page.url.endswith("/login")
        await context.close()


async def test_persian_admin_pages_read_right_to_left_and_fit_a_phone(
    db, fake_comfy_factory, shots
) -> None:
    """A browser asking for Persian gets right-to-left pages: table headers start at the
    right, nothing scrolls sideways on a phone, and every field still has its label."""
    # A GPU without models: the backends page lists long model file names it lacks.
    bare = await fake_comfy_factory(models={"diffusion_models": [], "text_encoders": [],
                                            "vae": [], "checkpoints": [], "loras": []})
    async with web_stack(db, [bare], worker=False) as stack, launch() as browser:
        context = await browser.new_context(
            java_script_enabled=False,
            locale="fa-IR",  # sends Accept-Language: fa-IR
            viewport={"width": 390, "height": 844},
        )
        context.set_default_timeout(TIMEOUT_MS)
        page = await context.new_page()
        await page.goto(await stack.invite(admin=True))
        assert await page.get_attribute("html", "dir") == "rtl"
        # the sign-up form by its Persian labels
        for field in await page.locator("input:not([type=hidden])").all():
            assert await field.get_attribute("id"), "a field without a label target"
            label = page.locator(f"label[for='{await field.get_attribute('id')}']")
            assert (await label.inner_text()).strip()
        inputs = page.locator("input:not([type=hidden])")
        await inputs.nth(0).fill("parisa")
        await inputs.nth(1).fill(PASSPHRASE)
        await inputs.nth(2).fill(PASSPHRASE)
        await page.locator("form button[type=submit]").click()
        await page.wait_for_url(re.compile(r"/$"))
        for path in ("/admin/users", "/admin/invites", "/admin/workflows", "/admin/backends",
                     "/c/f", "/settings"):
            await page.goto(stack.url + path)
            assert await page.get_attribute("html", "lang") == "fa", path
            width = await page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{path} scrolls sideways on a phone ({width} px)"
            for field in await page.locator(
                "main input:not([type=hidden]), main select, main textarea"
            ).all():
                field_id = await field.get_attribute("id")
                assert field_id and await page.locator(f"label[for='{field_id}']").count() == 1
        await page.goto(stack.url + "/admin/users")
        # "since 2026-12-03": a date on one line (broken at a hyphen it reads backwards)
        lines = await page.locator("time").evaluate_all(
            "times => times.map(t => t.getClientRects().length)"
        )
        assert lines and set(lines) == {1}, lines
        await page.goto(stack.url + "/c/f")
        # what users type takes its own direction; the seed's hint is in Persian too
        assert await page.get_attribute("#f-prompt", "dir") == "auto"
        assert await page.get_attribute("#f-seed", "placeholder") == "تصادفی"
        await page.goto(stack.url + "/admin/workflows")
        # "/f" inside a Persian button keeps its slash in front (a left-to-right isolate)
        buttons = await page.locator("form[action$='/disable'] button").all_inner_texts()
        assert "غیرفعال کردن \u2066/f\u2069" in buttons, buttons
        # a header's words sit at the cell's right (start) edge, not its left
        gaps = await page.locator("thead th").evaluate_all(
            """cells => cells.map(cell => { const range = document.createRange();
            range.selectNodeContents(cell); const text = range.getBoundingClientRect(),
            box = cell.getBoundingClientRect(); return [box.right - text.right,
            text.left - box.left]; })"""
        )
        words = [(right, left) for right, left in gaps if left + right > 0]
        assert words and all(right < left for right, left in words if left - right > 4), gaps
        assert any(left - right > 20 for right, left in words), gaps
        await page.screenshot(path=str(shots / "web-admin-rtl-phone.png"), full_page=True)
        await context.close()
