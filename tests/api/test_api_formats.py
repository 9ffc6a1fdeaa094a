"""Streaming and formats, honestly: `stream=true` answered as OpenAI's Server-Sent Events,
`output_format` and `output_compression` converting the result, the other fields clients
send accepted, edits as multipart (`image`, `image[]`) and as JSON with data URLs, and
the exact requests Open WebUI and LibreChat send."""

from __future__ import annotations

import asyncio
import base64
import io
import os
from pathlib import Path

import aiohttp
import pytest
from PIL import Image

from comfyveil import config
from comfyveil.comfy import workflow
from tests.api.test_api_openai import PROMPT, make_key, no_metadata, png, sdk
from tests.lazy import lazy_import
from tests.web.support import client, sign_up, web_stack

openai = lazy_import("openai")  # loaded by the first test that uses it

DATA = Path(__file__).parents[1] / "data" / "workflows"


# JFIF's header names the format and pixel density; it says nothing of who or how
JFIF = {
    "jfif",
    "jfif_version",
    "jfif_unit",
    "jfif_density",
    "dpi",
    "icc_profile",
    "progressive",
    "progression",
}


def no_jpeg_metadata(data: bytes) -> bool:
    with Image.open(io.BytesIO(data)) as image:
        return set(image.info) <= JFIF and not image.getexif()


def opened(data: bytes) -> tuple[str, tuple[int, int]]:
    with Image.open(io.BytesIO(data)) as image:
        return str(image.format), image.size


async def test_output_format_converts_and_a_format_not_offered_is_refused_by_name(
    db, fake_comfy
) -> None:
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "ada")
        api = sdk(stack.url, await make_key(session, stack.url))
        jpeg = await api.images.generate(
            model="f", prompt=PROMPT, size="256x256", output_format="jpeg", output_compression=40
        )
        data = base64.b64decode(jpeg.data[0].b64_json or "")
        assert opened(data) == ("JPEG", (256, 256)) and no_jpeg_metadata(data)
        assert PROMPT.encode() not in data
        webp = await api.images.generate(
            model="f", prompt=PROMPT, size="256x256", output_format="webp", response_format="url"
        )
        async with aiohttp.ClientSession() as anyone, anyone.get(webp.data[0].url or "") as r:
            assert r.status == 200 and r.content_type == "image/webp"
            assert opened(await r.read()) == ("WEBP", (256, 256))
        with pytest.raises(openai.BadRequestError, match="png, jpeg or webp") as gif:
            await api.images.generate(model="f", prompt=PROMPT, output_format="gif")
        assert gif.value.body["param"] == "output_format"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError, match="0 to 100"):
            await api.images.generate(
                model="f", prompt=PROMPT, output_format="jpeg", output_compression=101
            )
        assert await stack.job_count() == 2  # the refusals queued nothing


async def test_stream_answers_openais_events_and_the_sdk_iterates_them(db, fake_comfy) -> None:
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "bea")
        api = sdk(stack.url, await make_key(session, stack.url))
        stream = await api.images.generate(
            model="f",
            prompt=PROMPT,
            size="256x256",
            stream=True,
            partial_images=2,
            output_format="webp",
            quality="high",
        )
        events = [event async for event in stream]
        # this backend sends no previews: the completed event alone, as OpenAI sends it
        assert [e.type for e in events] == ["image_generation.completed"]
        done = events[0]
        assert done.size == "256x256" and done.output_format == "webp" and done.quality == "high"
        assert opened(base64.b64decode(done.b64_json)) == ("WEBP", (256, 256))

        edits = await api.images.edit(
            model="qwen", image=("in.png", png(), "image/png"), prompt="add a hat", stream=True
        )
        events = [event async for event in edits]
        assert [e.type for e in events] == ["image_edit.completed"]
        assert no_metadata(base64.b64decode(events[0].b64_json))

        # a job that fails ends the stream with the error, raised by the SDK
        fake_comfy.fail_next_execution("KSampler", "CUDA error", "RuntimeError")
        failing = await api.images.generate(model="f", prompt=PROMPT, stream=True)
        with pytest.raises(openai.APIError, match="The workflow failed on the GPU"):
            _ = [event async for event in failing]


async def test_partial_images_are_the_samplers_previews_forgotten_after_the_result(
    db, fake_comfy_factory
) -> None:
    comfy = await fake_comfy_factory(previews=True, step_delay=0.3)
    async with web_stack(db, [comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "fay")
        api = sdk(stack.url, await make_key(session, stack.url))
        plain = await api.images.generate(model="f", prompt=PROMPT, size="256x256")
        assert plain.data[0].b64_json
        stream = await api.images.generate(
            model="f", prompt=PROMPT, size="256x256", stream=True, partial_images=2
        )
        events = [event async for event in stream]
        kinds = [e.type for e in events]
        assert kinds[-1] == "image_generation.completed"
        partials = events[:-1]
        assert 1 <= len(partials) <= 2, kinds
        assert all(e.type == "image_generation.partial_image" for e in partials)
        assert [e.partial_image_index for e in partials] == list(range(len(partials)))
        for e in partials:  # a preview frame, not the result
            assert opened(base64.b64decode(e.b64_json))[1] != (256, 256)
        async with db.pool.connection() as conn:
            cursor = await conn.execute("SELECT count(*) AS n FROM job_previews")
            row = await cursor.fetchone()
        assert row["n"] == 0  # a stream's previews are forgotten once its result is sent


async def test_a_long_stream_says_it_is_alive_and_the_sdk_reads_past_it(
    db, fake_comfy, monkeypatch
) -> None:
    from comfyveil.api import retries

    monkeypatch.setattr(retries, "KEEPALIVE", 0.1)
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "eli")
        key = await make_key(session, stack.url)
        fake_comfy.pause()
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": "f", "prompt": PROMPT, "size": "256x256", "stream": True}
        async with (
            aiohttp.ClientSession(headers=headers) as raw,
            raw.post(stack.url + "/v1/images/generations", json=body) as r,
        ):
            assert r.status == 200 and r.content_type == "text/event-stream"
            assert await r.content.readline() == b": keep-alive\n"  # while the job waits
            fake_comfy.resume()
            rest = (await r.content.read()).decode()
        assert "event: image_generation.completed\n" in rest
        assert rest.count("event: ") == 1
        # the SDK skips the comments
        fake_comfy.pause()
        api = sdk(stack.url, key)
        stream = await api.images.generate(model="f", prompt=PROMPT, size="256x256", stream=True)

        async def later() -> None:
            await asyncio.sleep(0.3)  # a few keep-alives first
            fake_comfy.resume()

        resuming = asyncio.create_task(later())
        assert [e.type async for e in stream] == ["image_generation.completed"]
        await resuming


async def test_every_field_clients_send_is_taken_and_the_roughs_read_well(db, fake_comfy) -> None:
    limits = config.LimitsConfig(cooldown=0, max_prompt_length=40)
    async with web_stack(db, [fake_comfy], api=True, limits=limits) as stack, client() as s:
        await sign_up(s, await stack.invite(), "cem")
        api = sdk(stack.url, await make_key(s, stack.url))
        result = await api.images.generate(
            model="f",
            prompt=PROMPT,
            size="256x256",
            quality="hd",
            style="vivid",
            background="transparent",
            moderation="low",
            user="u-1",
            safety_identifier="s-1",
        )
        assert opened(base64.b64decode(result.data[0].b64_json or ""))[0] == "PNG"
        with pytest.raises(openai.BadRequestError) as nameless:
            await api.images.generate(model="", prompt=PROMPT)
        message = nameless.value.body["message"]  # type: ignore[index]
        assert "model  " not in message and message.startswith("Name a model: GET /v1/models")
        with pytest.raises(openai.BadRequestError) as zero:
            await api.images.generate(model="f", prompt=PROMPT, n=0)
        assert zero.value.body["message"] == "The number of images (n) is from 1 to 10."  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as long:
            await api.images.generate(model="f", prompt="x" * 41)
        # the chat's sentence, with the binding limit
        assert long.value.body["message"] == "The prompt is 41 characters long; the limit is 40."
        assert long.value.body["param"] == "prompt"  # type: ignore[index]
        assert await stack.job_count() == 1


async def test_open_webui_and_librechat_requests_as_they_send_them(db, fake_comfy) -> None:
    toml_text = (DATA / "invert.toml").read_text()
    graph = (DATA / "invert.json").read_text()
    await db.commands.add(workflow.loads("invert", toml_text, graph), toml_text, graph)
    async with web_stack(db, [fake_comfy], api=True) as stack, client() as session:
        await sign_up(session, await stack.invite(), "dan")
        key = await make_key(session, stack.url)
        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession(headers=headers) as raw:
            # Open WebUI's OpenAI engine: model, prompt, n, size (512x512 by default),
            # response_format b64_json
            webui = {
                "model": "f",
                "prompt": PROMPT,
                "n": 1,
                "size": "512x512",
                "response_format": "b64_json",
            }
            async with raw.post(stack.url + "/v1/images/generations", json=webui) as r:
                answer = await r.json()
                assert r.status == 200, answer
            assert opened(base64.b64decode(answer["data"][0]["b64_json"])) == ("PNG", (512, 512))

            # LibreChat: no response_format, quality/background/size auto, output_format
            librechat = {
                "model": "f",
                "prompt": PROMPT,
                "n": 1,
                "quality": "auto",
                "background": "auto",
                "output_format": "png",
                "size": "auto",
            }
            async with raw.post(stack.url + "/v1/images/generations", json=librechat) as r:
                answer = await r.json()
                assert r.status == 200, answer
            assert opened(base64.b64decode(answer["data"][0]["b64_json"]))[0] == "PNG"

            # Open WebUI's edits: multipart with `image`, or `image[]` for several
            for field in ("image", "image[]"):
                form = aiohttp.FormData()
                form.add_field("model", "qwen")
                form.add_field("prompt", "add a hat")
                form.add_field("n", "1")
                form.add_field("size", "512x512")
                form.add_field("response_format", "b64_json")
                form.add_field(field, png(), filename="in.png", content_type="image/png")
                async with raw.post(stack.url + "/v1/images/edits", data=form) as r:
                    answer = await r.json()
                    assert r.status == 200, (field, answer)
                assert answer["data"][0]["b64_json"]

            # JSON with data URLs, as OpenAI's newer clients send an edit; a model that
            # takes no prompt (an operator's /invert) takes the prompt and leaves it
            url = "data:image/png;base64," + base64.b64encode(png()).decode()
            noise = io.BytesIO()  # a larger body (~260 KB), as an image list
            Image.frombytes("RGB", (256, 256), os.urandom(256 * 256 * 3)).save(noise, "PNG")
            big = "data:image/png;base64," + base64.b64encode(noise.getvalue()).decode()
            for body in (
                {"model": "invert", "prompt": "make it pop", "images": [{"image_url": url}]},
                {"model": "qwen", "prompt": "add a hat", "image": url},
                {"model": "qwen", "prompt": "add a hat", "image[]": [big]},
            ):
                async with raw.post(stack.url + "/v1/images/edits", json=body) as r:
                    answer = await r.json()
                    assert r.status == 200, (body["model"], answer)
                assert answer["data"][0]["b64_json"]
            bad = {"model": "qwen", "prompt": "x", "image": "https://example.invalid/a.png"}
            async with raw.post(stack.url + "/v1/images/edits", json=bad) as r:
                assert r.status == 400 and "data: URL" in (await r.json())["error"]["message"]
        assert await stack.job_count() == 7
