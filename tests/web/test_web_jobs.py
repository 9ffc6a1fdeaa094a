"""Jobs from the web front end: forms, the job page, results only for their owner,
cancel, run again, history, gallery, settings and forgetting."""

from __future__ import annotations

import io
import re
import uuid

import aiohttp
from PIL import Image

from comfyveil.store import accounts, jobs
from tests.fixtures.photos import comfy_total_pixels, photo_png, size_of
from tests.web.support import NONCE, client, csrf_of, get_text, sign_up, wait_for, web_stack

JOB_URL = re.compile(r"/jobs/([0-9a-f-]{36})$")


async def submit_form(
    session: aiohttp.ClientSession,
    url: str,
    command: str,
    fields: dict[str, str],
    files: dict[str, bytes] | None = None,
) -> aiohttp.ClientResponse:
    _, page = await get_text(session, f"{url}/c/{command}")
    form = aiohttp.FormData()
    form.add_field("csrf", csrf_of(page))
    nonce = NONCE.search(page)
    assert nonce
    form.add_field("nonce", nonce.group(1))
    for key, value in fields.items():
        form.add_field(key, value)
    for key, data in (files or {}).items():
        form.add_field(key, data, filename="in.png", content_type="image/png")
    response = await session.post(f"{url}/c/{command}", data=form)
    await response.read()
    return response


async def finished(stack, job_id: uuid.UUID) -> jobs.Job:
    async def done() -> bool:
        job = await stack.db.jobs.get(job_id)
        return job is not None and job.status.finished

    await wait_for(done, timeout=30)
    job = await stack.db.jobs.get(job_id)
    assert job is not None
    return job


async def test_form_is_generated_from_the_workflow_with_labels(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        await sign_up(session, await stack.invite(), "fay")
        _, page = await get_text(session, stack.url + "/c/f")
        for name in ("prompt", "seed", "steps", "width", "height"):
            assert f'<label for="f-{name}">' in page and f'id="f-{name}"' in page
        assert 'type="number" id="f-steps" name="steps" value="4" min="1" max="8"' in page
        # The required prompt starts empty (the graph's own sample text is not the user's),
        # with an example as its placeholder (issue 23 rough).
        prompt = re.search(r'<textarea id="f-prompt"[^>]*>([^<]*)</textarea>', page)
        assert prompt is not None and prompt.group(1) == "", prompt
        assert 'placeholder="a fox in snow"' in prompt.group(0) and " required" in prompt.group(0)
        _, qwen = await get_text(session, stack.url + "/c/qwen")
        assert 'type="file" id="f-image"' in qwen and 'name="image__from"' in qwen


async def test_bad_input_is_shown_beside_the_field_and_nothing_is_queued(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        await sign_up(session, await stack.invite(), "gus")
        response = await submit_form(
            session, stack.url, "f", {"prompt": "a fox", "steps": "99", "width": "257"}
        )
        page = await response.text()
        assert response.status == 400
        assert re.search(r'id="e-steps">Steps must be between 1 and 8', page)
        assert 'id="e-width">' in page
        assert "Nothing was queued" in page
        assert 'value="a fox"' not in page and ">a fox</textarea>" in page  # kept
        response = await submit_form(session, stack.url, "qwen", {"prompt": "make it red"})
        assert response.status == 400 and 'id="e-image">' in await response.text()
        assert await stack.job_count() == 0


async def test_generate_result_download_edit_and_owner_only(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy]) as stack, client() as owner, client() as other:
        await sign_up(owner, await stack.invite(), "hana")
        await sign_up(other, await stack.invite(), "ivan")
        response = await submit_form(
            owner,
            stack.url,
            "f",
            {"prompt": "an astronaut", "steps": "2", "width": "256", "height": "256"},
        )
        assert response.status == 200
        match = JOB_URL.search(str(response.url))
        assert match, response.url
        job = await finished(stack, uuid.UUID(match.group(1)))
        assert job.status is jobs.Status.SUCCEEDED
        assert accounts.is_web_chat(job.chat_id) and job.user_id < 0
        status, page = await get_text(owner, f"{stack.url}/jobs/{job.id}")
        assert status == 200 and f'src="/jobs/{job.id}/out/0"' in page
        assert "http-equiv" not in page  # finished: no more refreshing
        async with owner.get(f"{stack.url}/jobs/{job.id}/out/0?download=1") as r:
            original = await r.read()
            assert r.status == 200 and r.headers["Content-Disposition"].startswith("attachment")
        assert original == (await stack.db.jobs.outputs(job.id))[0].data
        async with owner.get(f"{stack.url}/jobs/{job.id}/thumb/0") as r:
            assert r.content_type == "image/webp"
            assert Image.open(io.BytesIO(await r.read())).format == "WEBP"
        for path in (f"/jobs/{job.id}", f"/jobs/{job.id}/out/0", f"/jobs/{job.id}/thumb/0"):
            async with other.get(stack.url + path) as r:
                assert r.status == 404, path
        # Edit this: the edit form offers the result, chosen
        status, edit = await get_text(owner, f"{stack.url}/c/qwen?from={job.id}:0")
        assert f'<option value="{job.id}:0" selected>' in edit
        response = await submit_form(
            owner,
            stack.url,
            "qwen",
            {
                "prompt": "put a hat on him",
                "image__from": f"{job.id}:0",
                "steps": "1",
                "megapixels": "0.25",
            },
        )
        edit_id = uuid.UUID(JOB_URL.search(str(response.url)).group(1))  # type: ignore[union-attr]
        edited = await finished(stack, edit_id)
        assert edited.status is jobs.Status.SUCCEEDED
        # ivan cannot use hana's result as his input either
        response = await submit_form(
            other, stack.url, "qwen", {"prompt": "steal", "image__from": f"{job.id}:0"}
        )
        assert response.status == 400 and "not available" in await response.text()
        # history and gallery list hana's jobs only
        _, history = await get_text(owner, stack.url + "/history")
        assert str(job.id) in history and str(edit_id) in history
        _, gallery = await get_text(other, stack.url + "/gallery")
        assert str(job.id) not in gallery


async def test_job_page_refreshes_and_cancel_stops_a_slow_job(db, fake_comfy_factory) -> None:
    slow = await fake_comfy_factory(step_delay=0.5)
    async with web_stack(db, [slow]) as stack, client() as session:
        await sign_up(session, await stack.invite(), "jo")
        response = await submit_form(
            session,
            stack.url,
            "f",
            {"prompt": "a slow fox", "steps": "8", "width": "256", "height": "256"},
        )
        job_id = uuid.UUID(JOB_URL.search(str(response.url)).group(1))  # type: ignore[union-attr]

        async def running() -> bool:  # ComfyUI started it: its running time counts
            job = await stack.db.jobs.get(job_id)
            return (
                job is not None
                and job.executing_at is not None
                and (job.progress or {}).get("state") == "running"
            )

        await wait_for(running)
        _, page = await get_text(session, f"{stack.url}/jobs/{job_id}")
        assert '<meta http-equiv="refresh" content="2">' in page
        assert "Elapsed" in page
        async with session.post(
            f"{stack.url}/jobs/{job_id}/cancel", data={"csrf": csrf_of(page)}
        ) as r:
            assert r.status == 200
        job = await finished(stack, job_id)
        assert job.status is jobs.Status.CANCELLED
        assert slow.interrupts


async def test_run_again_settings_and_forget(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy]) as stack, client() as session:
        await sign_up(session, await stack.invite(), "kim")
        _, page = await get_text(session, stack.url + "/settings")
        async with session.post(
            stack.url + "/settings", data={"csrf": csrf_of(page), "steps": "3", "seed": "42"}
        ) as r:
            assert "Saved." in await r.text()
        _, form = await get_text(session, stack.url + "/c/f")
        assert 'name="steps" value="3"' in form and 'name="seed" value="42"' in form
        response = await submit_form(
            session,
            stack.url,
            "f",
            {  # as the browser sends it
                "prompt": "a fox",
                "width": "256",
                "height": "256",
                "steps": "3",
                "seed": "42",
            },
        )
        first = await finished(stack, uuid.UUID(JOB_URL.search(str(response.url)).group(1)))  # type: ignore[union-attr]
        assert first.params["seed"] == 42 and first.params["steps"] == 3
        _, page = await get_text(session, f"{stack.url}/jobs/{first.id}")
        async with session.post(
            f"{stack.url}/jobs/{first.id}/again", data={"csrf": csrf_of(page), "nonce": "again1"}
        ) as r:
            again_id = uuid.UUID(JOB_URL.search(str(r.url)).group(1))  # type: ignore[union-attr]
        assert again_id != first.id
        again = await finished(stack, again_id)
        assert again.params["steps"] == 3 and again.params["prompt"] == "a fox"
        _, page = await get_text(session, stack.url + "/forget")
        async with session.post(stack.url + "/forget", data={"csrf": csrf_of(page)}) as r:
            assert r.status == 400  # not confirmed: nothing deleted
        assert await stack.job_count() == 2
        async with session.post(
            stack.url + "/forget", data={"csrf": csrf_of(page), "confirm": "yes"}
        ) as r:
            assert "Everything stored about you was deleted." in await r.text()
        assert await stack.job_count() == 0
        account = await stack.store.account_by_name("kim")
        assert account is not None
        assert await stack.db.users.get(account.user_id) is None  # settings gone too


async def test_deleting_the_account_says_so_and_the_page_tells_what_happens_to_a_running_job(
    db, fake_comfy
) -> None:
    """The page said a running job "finishes there" (the chat's /forget, rightly, that it
    is stopped), and deleting the account landed on the login page without a word."""
    async with web_stack(db, [fake_comfy], worker=False) as stack, client() as session:
        await sign_up(session, await stack.invite(), "ned")
        _, page = await get_text(session, stack.url + "/forget")
        assert "stops a job running now on its GPU" in page and "finishes there" not in page
        async with session.post(
            stack.url + "/forget", data={"csrf": csrf_of(page), "confirm": "yes", "account": "yes"}
        ) as r:
            assert r.url.path == "/login"
            assert "Your account and everything stored about you were deleted." in await r.text()
        assert await stack.store.account_by_name("ned") is None
        _, login = await get_text(session, stack.url + "/login")
        assert "were deleted" not in login  # said once, after the deletion only


async def test_an_uploaded_input_is_shown_to_its_owner_only(db, fake_comfy_factory) -> None:
    slow = await fake_comfy_factory(step_delay=0.5)
    upload = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(upload, "PNG")
    async with web_stack(db, [slow]) as stack, client() as owner, client() as other:
        await sign_up(owner, await stack.invite(), "lou")
        await sign_up(other, await stack.invite(), "max")
        response = await submit_form(
            owner,
            stack.url,
            "qwen",
            {"prompt": "make it blue", "steps": "8", "megapixels": "0.25"},
            files={"image": upload.getvalue()},
        )
        assert response.status == 200, await response.text()
        job_id = uuid.UUID(JOB_URL.search(str(response.url)).group(1))  # type: ignore[union-attr]
        _, page = await get_text(owner, f"{stack.url}/jobs/{job_id}")
        assert f'src="/jobs/{job_id}/in/0"' in page
        async with owner.get(f"{stack.url}/jobs/{job_id}/in/0") as r:
            assert r.status == 200 and await r.read() == upload.getvalue()
        async with other.get(f"{stack.url}/jobs/{job_id}/in/0") as r:
            assert r.status == 404
        await finished(stack, job_id)


async def test_a_large_upload_reaches_the_gpu_host_at_the_size_qwen_uses(
    db, fake_comfy
) -> None:
    data = photo_png(800, 600)
    async with web_stack(db, [fake_comfy]) as stack, client() as session:
        await sign_up(session, await stack.invite(), "uma")
        response = await submit_form(
            session,
            stack.url,
            "qwen",
            {"prompt": "make it blue", "steps": "2", "megapixels": "0.25"},
            files={"image": data},
        )
        assert response.status == 200, await response.text()
        job_id = uuid.UUID(JOB_URL.search(str(response.url)).group(1))  # type: ignore[union-attr]
        await finished(stack, job_id)
        sent = [u["data"] for u in fake_comfy.uploads if not u["overwrite"]][-1]
        assert size_of(sent) == comfy_total_pixels(800, 600, 0.25) and len(sent) < len(data)
        async with session.get(f"{stack.url}/jobs/{job_id}/in/0") as r:
            assert await r.read() == data  # the kept input is the user's own


async def test_a_failed_job_says_one_plain_sentence_and_only_admins_see_the_detail(
    db, fake_comfy
) -> None:
    async with (
        web_stack(db, [fake_comfy]) as stack,
        client() as user,
        client() as admin,
    ):
        await sign_up(user, await stack.invite(), "lou")
        await sign_up(admin, await stack.invite(admin=True), "ops")
        pages = {}
        for name, session in (("lou", user), ("ops", admin)):
            fake_comfy.fail_next_execution(
                "KSampler", "CUDA error: an illegal memory access at 0x7f3a", "RuntimeError"
            )
            response = await submit_form(
                session, stack.url, "f", {"prompt": "a fox", "width": "256", "height": "256"}
            )
            job_id = uuid.UUID(JOB_URL.search(str(response.url)).group(1))  # type: ignore[union-attr]
            job = await finished(stack, job_id)
            assert job.status is jobs.Status.FAILED and "KSampler" in (job.error or "")
            _, pages[name] = await get_text(session, f"{stack.url}/jobs/{job_id}")
        sentence = "The workflow failed on the GPU; please try again later."
        assert f'<p class="problem">{sentence}</p>' in pages["lou"]
        for secret in ("KSampler", "CUDA", "0x7f3a", "RuntimeError", "Traceback"):
            assert secret not in pages["lou"], secret
        # the admin reads the same sentence, then the backend's own account
        assert sentence in pages["ops"] and "KSampler" in pages["ops"]


async def test_run_again_is_offered_only_where_a_new_seed_changes_something(
    db, fake_comfy
) -> None:
    """"Run again (new seed)" is for a workflow with a seed, and not for a job that
    failed because no GPU has its model (again, it could only fail the same way)."""
    again = "Run again (new seed)"
    async with web_stack(db, [fake_comfy]) as stack, client() as session:
        await sign_up(session, await stack.invite(), "rio")
        account = await stack.store.account_by_name("rio")
        assert account is not None
        made = await submit_form(
            session, stack.url, "f", {"prompt": "a fox", "width": "256", "height": "256"}
        )
        seeded = await finished(stack, uuid.UUID(JOB_URL.search(str(made.url)).group(1)))  # type: ignore[union-attr]
        _, page = await get_text(session, f"{stack.url}/jobs/{seeded.id}")
        assert again in page
        # A job of a workflow without a seed; and one that failed for a missing model.
        unseeded = await stack.db.jobs.enqueue(jobs.NewJob(
            user_id=account.user_id, chat_id=account.chat_id, command="f",
            workflow_hash=seeded.workflow_hash, params={"prompt": "a fox"}))
        missing = await stack.db.jobs.enqueue(jobs.NewJob(
            user_id=account.user_id, chat_id=account.chat_id, command="f",
            workflow_hash=seeded.workflow_hash, params=dict(seeded.params)))
        async with stack.db.pool.connection() as conn:
            await conn.execute(
                "UPDATE jobs SET status = 'succeeded', finished_at = now() WHERE id = %(id)s",
                {"id": unseeded.id},
            )
            await conn.execute(
                "UPDATE jobs SET status = 'failed', finished_at = now(), error = %(error)s "
                "WHERE id = %(id)s",
                {"id": missing.id,
                 "error": "model file flux1-schnell.safetensors is not installed on backend gpu0"},
            )
        for job in (unseeded, missing):
            _, page = await get_text(session, f"{stack.url}/jobs/{job.id}")
            assert again not in page, job.params
            async with session.post(f"{stack.url}/jobs/{job.id}/again",
                                    data={"csrf": csrf_of(page), "nonce": f"n{job.id.hex}"}) as r:
                assert r.status == 400
        assert await stack.job_count() == 3  # nothing was queued by those posts


FLUX_ONLY = {"diffusion_models": ["flux1-schnell.safetensors"],
             "text_encoders": ["clip_l.safetensors", "t5xxl_fp16.safetensors"],
             "vae": ["ae.safetensors"], "checkpoints": [], "loras": []}


async def test_commands_no_gpu_can_run_are_marked_refused_and_not_offered(
    db, fake_comfy_factory
) -> None:
    """The chat's availability rule on the web (issue 23 item 5): a GPU with Flux Schnell's
    models only: /f is offered, the others are marked on the home page, refused in one
    sentence when sent anyway, and no result offers "Edit this with /qwen"."""
    fake = await fake_comfy_factory(models=FLUX_ONLY)
    async with web_stack(db, [fake]) as stack, client() as session:
        await sign_up(session, await stack.invite(), "ada")
        _, home = await get_text(session, stack.url + "/")
        assert 'href="/c/f"' in home and 'href="/c/qwen"' not in home
        qwen = re.search(r"<li[^>]*>[^\n]*/qwen[^\n]*</li>", home)
        assert qwen is not None and "not available right now" in qwen.group(0)
        refused = await submit_form(
            session, stack.url, "sd3", {"prompt": "a fox", "width": "256", "height": "256"}
        )
        text = await refused.text()
        assert refused.status == 400
        assert "/sd3 is not available right now: no GPU has its model." in text
        assert await stack.job_count() == 0
        made = await submit_form(
            session, stack.url, "f", {"prompt": "a fox", "width": "256", "height": "256"}
        )
        job = await finished(stack, uuid.UUID(JOB_URL.search(str(made.url)).group(1)))  # type: ignore[union-attr]
        assert job.status is jobs.Status.SUCCEEDED
        _, page = await get_text(session, f"{stack.url}/jobs/{job.id}")
        assert "/c/qwen?from=" not in page
