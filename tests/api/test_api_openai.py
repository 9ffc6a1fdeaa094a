"""The images API through OpenAI's own SDK, pointed at the test server with `base_url`:
what Open WebUI and scripts written for OpenAI send, and the exception class the SDK
raises for each refusal."""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import re

import aiohttp
import pytest
from PIL import Image

from comfyveil import config, policy
from comfyveil.store import api_keys, jobs
from tests.fixtures.photos import comfy_total_pixels, photo_png, size_of
from tests.lazy import lazy_import
from tests.web.support import client, csrf_of, get_text, sign_up, web_stack

openai = lazy_import("openai")  # loaded by the first test that uses it

KEY = re.compile(r"<code dir=\"ltr\">(cv-[A-Za-z0-9_-]+)</code>")
PROMPT = "an astronaut on a red horse"


def sdk(url: str, key: str) -> openai.AsyncOpenAI:
    # no retries: a refusal is seen as the SDK raises it, not waited out
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def no_metadata(data: bytes) -> bool:
    with Image.open(io.BytesIO(data)) as image:
        return set(image.info) <= {"dpi", "icc_profile"} and not image.getexif()


async def make_key(session: aiohttp.ClientSession, url: str, label: str = "webui") -> str:
    """A key made on the settings page, as a user does."""
    _, page = await get_text(session, url + "/settings")
    async with session.post(
        url + "/settings/keys", data={"csrf": csrf_of(page), "label": label}
    ) as response:
        text = await response.text()
        assert response.status == 200, text
    found = KEY.search(text)
    assert found, "the new key is shown once"
    return found.group(1)


def png(size: tuple[int, int] = (96, 64)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (20, 120, 200)).save(out, "PNG")
    return out.getvalue()


async def test_generate_as_b64_and_url_list_models_and_keys_on_the_settings_page(
    db, fake_comfy, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "olga")
        key = await make_key(session, stack.url)
        _, settings = await get_text(session, stack.url + "/settings")
        assert key not in settings and key[-4:] in settings and "webui" in settings
        api = sdk(stack.url, key)

        models = {m.id for m in (await api.models.list()).data}
        assert {"f", "qwen"} <= models

        result = await api.images.generate(
            model="f", prompt=PROMPT, n=2, size="320x256", response_format="b64_json"
        )
        assert len(result.data) == 2 and result.created > 0
        pictures = [base64.b64decode(d.b64_json or "") for d in result.data]
        for data in pictures:
            with Image.open(io.BytesIO(data)) as image:
                assert image.size == (320, 256)
            assert no_metadata(data) and PROMPT.encode() not in data

        # a key's jobs are the account's: on its history page, with two seeds
        _, history = await get_text(session, stack.url + "/history")
        async with db.pool.connection() as conn:
            rows = await (await conn.execute("SELECT id, params FROM jobs")).fetchall()
        assert len(rows) == 2 and rows[0]["params"]["seed"] != rows[1]["params"]["seed"]
        assert all(str(r["id"]) in history for r in rows)

        linked = await api.images.generate(model="f", prompt=PROMPT, response_format="url")
        url = linked.data[0].url or ""
        assert url.startswith(stack.url + "/v1/files/")
        async with aiohttp.ClientSession() as anyone:  # the link alone is the permission
            async with anyone.get(url) as r:
                assert r.status == 200 and r.content_type == "image/png"
                assert no_metadata(await r.read())
            async with anyone.get(url.replace("sig=", "sig=0")) as r:
                assert r.status == 403
                assert (await r.json())["error"]["code"] == "invalid_link"
        assert PROMPT not in caplog.text and key not in caplog.text


async def test_edit_with_an_image_and_a_mask_refused_in_words(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "pia")
        api = sdk(stack.url, await make_key(session, stack.url))
        edited = await api.images.edit(
            model="qwen", image=("in.png", png(), "image/png"), prompt="add a hat"
        )
        assert len(edited.data) == 1
        assert no_metadata(base64.b64decode(edited.data[0].b64_json or ""))
        job = (await stack.db.jobs.list_for_user(await _user(stack, "pia")))[0]
        assert job.command == "qwen" and job.status is jobs.Status.SUCCEEDED
        with pytest.raises(openai.BadRequestError, match="takes no mask") as refused:
            await api.images.edit(
                model="qwen",
                image=("in.png", png(), "image/png"),
                mask=("m.png", png(), "image/png"),
                prompt="add a hat",
            )
        assert refused.value.body["param"] == "mask"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError, match="takes no image"):
            await api.images.edit(model="f", image=("in.png", png(), "image/png"), prompt="x")
        with pytest.raises(openai.BadRequestError, match="image"):
            await api.images.edit(
                model="qwen", image=("in.png", b"not a png", "image/png"), prompt="x"
            )


async def test_a_large_edit_reaches_the_gpu_host_at_the_size_qwen_uses(db, fake_comfy) -> None:
    data = photo_png(1200, 1000)  # qwen scales its input to 1 megapixel first
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "ivo")
        api = sdk(stack.url, await make_key(session, stack.url))
        await api.images.edit(model="qwen", image=("in.png", data, "image/png"), prompt="a hat")
        sent = [u["data"] for u in fake_comfy.uploads if not u["overwrite"]][-1]
        assert size_of(sent) == comfy_total_pixels(1200, 1000, 1.0) and len(sent) < len(data)
        job = (await stack.db.jobs.list_for_user(await _user(stack, "ivo")))[0]
        assert (await stack.db.jobs.inputs(job.id))[0].data == data


async def _user(stack, name: str) -> int:
    account = await stack.store.account_by_name(name)
    assert account is not None
    return account.user_id


async def test_each_refusal_is_the_sdks_exception_for_its_status(db, fake_comfy) -> None:
    terms = policy.from_table({"terms": ["gore"]})
    async with (
        web_stack(db, [fake_comfy], api=True, policy=terms) as stack,
        client() as session,
    ):
        await sign_up(session, await stack.invite(), "quinn")
        key = await make_key(session, stack.url)
        api = sdk(stack.url, key)
        with pytest.raises(openai.AuthenticationError, match="not valid"):
            await sdk(stack.url, "cv-" + "x" * 43).images.generate(model="f", prompt=PROMPT)
        with pytest.raises(openai.AuthenticationError):
            await sdk(stack.url, "sk-wrong").models.list()
        with pytest.raises(openai.NotFoundError, match="no model sdxl") as missing:
            await api.images.generate(model="sdxl", prompt=PROMPT)
        assert missing.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError) as small:
            await api.images.generate(model="f", prompt=PROMPT, size="12x12")
        assert small.value.body["param"] == "size"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError, match="1024x1024"):
            await api.images.generate(model="f", prompt=PROMPT, size="big")  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError, match="from 1 to 10"):
            await api.images.generate(model="f", prompt=PROMPT, n=11)
        with pytest.raises(openai.BadRequestError) as refused:
            await api.images.generate(model="f", prompt="lots of gore")
        assert refused.value.code == "content_policy_violation"
        assert await stack.job_count() == 0  # nothing refused was queued
        # a revoked key stops working at once
        _, settings = await get_text(session, stack.url + "/settings")
        key_id = (await api_keys.ApiKeyStore(db.pool).keys(await _account(stack, "quinn")))[0].id
        async with session.post(
            f"{stack.url}/settings/keys/{key_id}/revoke", data={"csrf": csrf_of(settings)}
        ) as r:
            assert r.status == 200
        with pytest.raises(openai.AuthenticationError):
            await api.models.list()


async def _account(stack, name: str) -> int:
    account = await stack.store.account_by_name(name)
    assert account is not None
    return account.id


async def test_quota_reached_is_429_with_retry_after(db, fake_comfy) -> None:
    limits = config.LimitsConfig(daily_quota=1, cooldown=0)
    async with web_stack(db, [fake_comfy], api=True, limits=limits) as stack, client() as s:
        await sign_up(s, await stack.invite(), "rosa")
        api = sdk(stack.url, await make_key(s, stack.url))
        assert len((await api.images.generate(model="f", prompt=PROMPT)).data) == 1
        with pytest.raises(openai.RateLimitError, match="daily quota") as limited:
            await api.images.generate(model="f", prompt=PROMPT)
        assert int(limited.value.response.headers["Retry-After"]) > 0
        assert await stack.job_count() == 1


async def test_no_gpu_for_the_model_is_503(db, fake_comfy_factory) -> None:
    comfy = await fake_comfy_factory(models={"checkpoints": []})
    async with web_stack(db, [comfy], api=True, worker=False) as stack, client() as s:
        await sign_up(s, await stack.invite(), "sami")
        api = sdk(stack.url, await make_key(s, stack.url))

        async def refused() -> openai.APIStatusError | None:
            try:
                await api.images.generate(model="f", prompt=PROMPT)
            except openai.APIStatusError as exc:
                return exc
            return None

        for _ in range(50):  # until the pool has read the GPU's models
            error = await refused()
            if isinstance(error, openai.InternalServerError) and error.status_code == 503:
                break
            await asyncio.sleep(0.1)
        assert isinstance(error, openai.InternalServerError) and error.status_code == 503
        assert "not available" in error.message
        assert await stack.job_count() == 0


async def test_a_malformed_request_never_gets_a_traceback(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], api=True, worker=False) as stack, client() as s:
        await sign_up(s, await stack.invite(), "tess")
        key = await make_key(s, stack.url)
        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession(headers=headers) as raw:
            for body in (b"{", b"[]", b'{"model": "f", "prompt": 5}', b'{"model": "f"}'):
                async with raw.post(
                    stack.url + "/v1/images/generations",
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as r:
                    answer = await r.json()
                    assert r.status == 400 and "Traceback" not in str(answer)
                    assert set(answer["error"]) == {"message", "type", "param", "code"}
            async with raw.get(stack.url + "/v1/nothing") as r:
                assert r.status == 404 and "error" in await r.json()
        assert await stack.job_count() == 0


async def test_a_failed_job_is_a_500_in_one_plain_sentence(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as s:
        await sign_up(s, await stack.invite(), "uri")
        api = sdk(stack.url, await make_key(s, stack.url))
        fake_comfy.fail_next_execution(
            "KSampler", "CUDA error: an illegal memory access at 0x7f3a", "RuntimeError"
        )
        with pytest.raises(openai.InternalServerError) as failed:
            await api.images.generate(model="f", prompt=PROMPT, size="256x256")
        assert failed.value.status_code == 500 and failed.value.code == "job_failed"
        assert "The workflow failed on the GPU" in failed.value.message
        for secret in ("KSampler", "CUDA", "0x7f3a", "RuntimeError", "Traceback"):
            assert secret not in str(failed.value.body), secret
        too_many = [("in.png", png(), "image/png")] * 5
        with pytest.raises(openai.BadRequestError, match="too many parts"):
            await api.images.edit(model="qwen", image=too_many, prompt="x")


async def test_a_ban_refuses_the_keys_requests_at_once_and_a_lifted_one_lets_them_in(
    db, fake_comfy
) -> None:
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "sven")
        api = sdk(stack.url, await make_key(session, stack.url))
        user_id = await _user(stack, "sven")
        await db.users.set_role(user_id, "banned")
        with pytest.raises(openai.PermissionDeniedError) as banned:
            await api.images.generate(model="f", prompt=PROMPT)
        assert banned.value.code == "not_allowed"
        assert await stack.job_count() == 0
        await db.users.set_role(user_id, "user")
        assert len((await api.images.generate(model="f", prompt=PROMPT)).data) == 1


async def test_models_lists_only_what_some_gpu_can_run_now(db, fake_comfy_factory) -> None:
    """As the chat's menu and the web's list do: a model no GPU can run is left out, not
    listed to answer 503 to every request."""
    schnell_only = {
        "diffusion_models": ["flux1-schnell.safetensors"],
        "text_encoders": ["clip_l.safetensors", "t5xxl_fp16.safetensors"],
        "vae": ["ae.safetensors"],
    }
    comfy = await fake_comfy_factory(models=schnell_only)
    async with web_stack(db, [comfy], api=True, worker=False) as stack, client() as s:
        await sign_up(s, await stack.invite(), "lena")
        api = sdk(stack.url, await make_key(s, stack.url))

        async def listed() -> set[str]:
            return {m.id for m in (await api.models.list()).data}

        for _ in range(50):  # until the pool has read the GPU's models
            if await listed() == {"f"}:
                break
            await asyncio.sleep(0.1)
        assert await listed() == {"f"}  # not fd, sd3, wan or qwen: their files are missing
