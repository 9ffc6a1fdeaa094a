"""The fake ComfyUI matches the captures in notes/comfyui-api.md, spoken to raw."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.fakes.comfyui import FakeComfyUI

PROMPT = {
    "1": {"class_type": "EmptyImage",
          "inputs": {"width": 16, "height": 16, "batch_size": 2, "color": 0}},
    "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "p"}},
}


async def _until_done(ws: ClientConnection, prompt_id: str) -> list[Any]:
    frames: list[Any] = []
    while True:
        raw = await asyncio.wait_for(ws.recv(), 5)
        frames.append(raw if isinstance(raw, bytes) else json.loads(raw))
        if isinstance(raw, str):
            msg = frames[-1]
            if msg["type"] == "executing" and msg["data"].get("node") is None \
                    and msg["data"].get("prompt_id") == prompt_id:
                return frames


def _kinds(frames: list[Any]) -> list[str]:
    return ["<binary>" if isinstance(f, bytes) else f["type"] for f in frames]


async def test_event_order_of_a_fresh_and_a_cached_run(fake_comfy: FakeComfyUI) -> None:
    ws_url = fake_comfy.url.replace("http", "ws") + "/ws?clientId=probe-1"
    async with connect(ws_url) as ws, httpx.AsyncClient(base_url=fake_comfy.url) as http:
        hello = json.loads(await ws.recv())
        assert hello == {"type": "status", "data": {
            "status": {"exec_info": {"queue_remaining": 0}}, "sid": "probe-1"}}
        body = {"prompt": PROMPT, "client_id": "probe-1"}
        answer = (await http.post("/prompt", json=body)).json()
        assert answer["number"] == 0 and answer["node_errors"] == {}
        frames = await _until_done(ws, answer["prompt_id"])
        assert _kinds(frames) == [
            "status", "status", "execution_start", "execution_cached", "progress_state",
            "executing", "progress_state", "progress_state", "executing", "executed",
            "progress_state", "execution_success", "status", "executing"]
        executed = frames[9]["data"]["output"]["images"]
        assert [i["filename"] for i in executed] == ["p_00001_.png", "p_00002_.png"]
        assert frames[-2]["data"]["status"]["exec_info"]["queue_remaining"] == 0

        again = (await http.post("/prompt", json={"prompt": PROMPT, "client_id": "probe-1"})).json()
        frames = await _until_done(ws, again["prompt_id"])
        assert _kinds(frames) == [
            "status", "status", "execution_start", "execution_cached", "executed",
            "progress_state", "execution_success", "status", "executing"]
        assert frames[3]["data"]["nodes"] == ["1", "2"]
        assert frames[4]["data"]["output"]["images"] == executed
        history = (await http.get(f"/history/{again['prompt_id']}")).json()[again["prompt_id"]]
        assert history["status"]["status_str"] == "success"
        assert [m[0] for m in history["status"]["messages"]] == [
            "execution_start", "execution_cached", "execution_success"]


async def test_previews_legacy_then_with_metadata(fake_comfy: FakeComfyUI) -> None:
    prompt = {"1": PROMPT["1"],
              "2": {"class_type": "SaveImageWebsocket", "inputs": {"images": ["1", 0]}}}
    base = fake_comfy.url.replace("http", "ws")
    async with httpx.AsyncClient(base_url=fake_comfy.url) as http:
        async with connect(base + "/ws?clientId=legacy") as ws:
            await ws.recv()
            pid = (await http.post("/prompt", json={"prompt": prompt, "client_id": "legacy"})
                   ).json()["prompt_id"]
            kinds = _kinds(await _until_done(ws, pid))
            assert "executed" not in kinds
            assert kinds.count("<binary>") == 2
            i = kinds.index("progress")
            assert kinds[i - 1: i + 2] == ["progress_state", "progress", "<binary>"]
        async with connect(base + "/ws?clientId=modern") as ws:
            await ws.recv()
            await ws.send('{"type":"feature_flags","data":{"supports_preview_metadata":true}}')
            flags = json.loads(await ws.recv())
            assert flags == {"type": "feature_flags", "data": {
                "supports_preview_metadata": True, "max_upload_size": 104857600}}
            prompt["1"]["inputs"]["color"] = 1  # not cached
            pid = (await http.post("/prompt", json={"prompt": prompt, "client_id": "modern"})
                   ).json()["prompt_id"]
            frames = await _until_done(ws, pid)
            kinds = _kinds(frames)
            i = kinds.index("<binary>")
            assert kinds[i - 1: i + 2] == ["progress_state", "<binary>", "progress"]
            assert frames[i][:4] == b"\x00\x00\x00\x04"


async def test_duplicate_client_id_silences_the_survivor(fake_comfy: FakeComfyUI) -> None:
    base = fake_comfy.url.replace("http", "ws") + "/ws?clientId=dup"
    async with connect(base) as first:
        await first.recv()
        async with connect(base) as second:
            await second.recv()
            await first.close()
            await asyncio.sleep(0.05)
            async with httpx.AsyncClient(base_url=fake_comfy.url) as http:
                await http.post("/prompt", json={"prompt": PROMPT, "client_id": "dup"})
            try:
                got = await asyncio.wait_for(second.recv(), 0.3)
            except TimeoutError:
                got = None
    assert got is None  # not even the status broadcast


async def test_http_quirks(fake_comfy: FakeComfyUI) -> None:
    async with httpx.AsyncClient(base_url=fake_comfy.url) as http:
        numbered = (await http.post("/prompt", json={"prompt": PROMPT, "number": -100})).json()
        assert numbered["number"] == -100.0
        no_prompt = await http.post("/prompt", json={})
        assert no_prompt.status_code == 400
        assert no_prompt.json()["error"]["type"] == "no_prompt"
        counted = (await http.post("/prompt", json={"prompt": PROMPT, "front": True})).json()
        assert counted["number"] == -1  # the failed POST above counted too
        partial = {**PROMPT, "3": {"class_type": "LoadImage", "inputs": {"image": "x.png"}},
                   "4": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}}}
        answer = await http.post("/prompt", json={"prompt": partial})
        assert answer.status_code == 200
        assert answer.json()["node_errors"]["3"]["errors"][0]["details"] == (
            "image - Invalid image file: x.png")
        mismatch = await http.post("/prompt", json={"prompt": {
            "1": {"class_type": "EmptyLatentImage",
                  "inputs": {"width": 64, "height": 64, "batch_size": 1}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0],
                                                        "filename_prefix": "x"}}}})
        assert mismatch.json()["error"]["details"] == (
            "Return type mismatch between linked nodes: "
            "images, received_type(LATENT) mismatch input_type(IMAGE)")
        assert (await http.post("/queue", json={"clear": True})).content == b""
        assert (await http.post("/interrupt")).content == b""
        assert (await http.get("/view", params={"filename": "../x"})).status_code == 400
        assert (await http.get("/view", params={"filename": "a.png",
                                                "subfolder": ".."})).status_code == 403
        assert (await http.get("/view", params={"filename": "a.png",
                                                "type": "bogus"})).status_code == 400
        assert (await http.get("/view", params={"filename": "nope.png"})).status_code == 404
        assert (await http.get("/history", params={"max_items": "abc"})).status_code == 500
        assert (await http.get("/object_info/NoSuchNode")).json() == {}
        assert (await http.delete("/prompt")).status_code == 405


async def test_cached_nodes_are_not_listed_as_executed_on_error(fake_comfy: FakeComfyUI) -> None:
    async with httpx.AsyncClient(base_url=fake_comfy.url) as http:
        await http.post("/prompt", json={"prompt": PROMPT})
        escape = {"1": PROMPT["1"], "2": {"class_type": "SaveImage", "inputs": {
            "images": ["1", 0], "filename_prefix": "../escape"}}}
        pid = (await http.post("/prompt", json={"prompt": escape})).json()["prompt_id"]
        for _ in range(100):
            entry = (await http.get(f"/history/{pid}")).json().get(pid)
            if entry:
                break
            await asyncio.sleep(0.02)
    messages = dict((m[0], m[1]) for m in entry["status"]["messages"])
    assert messages["execution_cached"]["nodes"] == ["1"]
    assert messages["execution_error"]["executed"] == []  # node 1 came from the cache


async def test_save_image_websocket_reruns_and_its_bar_ends_at_its_max(
    fake_comfy: FakeComfyUI,
) -> None:
    prompt = {"1": PROMPT["1"],
              "2": {"class_type": "SaveImageWebsocket", "inputs": {"images": ["1", 0]}}}
    ws_url = fake_comfy.url.replace("http", "ws") + "/ws?clientId=sw"
    async with connect(ws_url) as ws, httpx.AsyncClient(base_url=fake_comfy.url) as http:
        await ws.recv()
        runs = []
        for _ in range(2):
            pid = (await http.post("/prompt", json={"prompt": prompt, "client_id": "sw"})
                   ).json()["prompt_id"]
            runs.append(await _until_done(ws, pid))
    for frames in runs:
        assert _kinds(frames).count("<binary>") == 2  # IS_CHANGED is the time: never cached
        last = [f for f in frames if isinstance(f, dict) and f["type"] == "progress_state"][-1]
        node = last["data"]["nodes"]["2"]
        assert (node["state"], node["value"], node["max"]) == ("finished", 2, 2)
    cached = [f for f in runs[1] if isinstance(f, dict) and f["type"] == "execution_cached"]
    assert cached[0]["data"]["nodes"] == ["1"]


async def test_progress_of_a_prompt_without_client_id_reaches_every_socket(
    fake_comfy: FakeComfyUI,
) -> None:
    ws_url = fake_comfy.url.replace("http", "ws") + "/ws?clientId=onlooker"
    async with connect(ws_url) as ws, httpx.AsyncClient(base_url=fake_comfy.url) as http:
        await ws.recv()
        await http.post("/prompt", json={"prompt": PROMPT})
        frames: list[Any] = []
        while not (frames and frames[-1]["type"] == "status"
                   and frames[-1]["data"]["status"]["exec_info"]["queue_remaining"] == 0):
            frames.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
    # what a real 0.3.64 sent to a foreign socket: statuses and every progress_state
    assert _kinds(frames) == ["status", "status"] + ["progress_state"] * 4 + ["status"]
    assert frames[-2]["data"]["nodes"]["2"]["state"] == "finished"


async def test_load_image_list_follows_the_input_folder(fake_comfy: FakeComfyUI) -> None:
    fake_comfy.put_input("a.png", b"x")
    fake_comfy.put_input("notes.txt", b"x")
    (fake_comfy.dirs["input"] / "sub").mkdir()
    (fake_comfy.dirs["input"] / "sub" / "deep.png").write_bytes(b"x")
    async with httpx.AsyncClient(base_url=fake_comfy.url) as http:
        def listed(info: dict[str, Any]) -> list[str]:
            return list(info["LoadImage"]["input"]["required"]["image"][0])

        assert listed((await http.get("/object_info/LoadImage")).json()) == ["a.png"]
        fake_comfy.put_input("b.webp", b"x")
        assert listed((await http.get("/object_info/LoadImage")).json()) == ["a.png", "b.webp"]
        assert listed((await http.get("/object_info")).json()) == ["a.png", "b.webp"]


async def test_models_and_request_shape_quirks(fake_comfy: FakeComfyUI) -> None:
    async with httpx.AsyncClient(base_url=fake_comfy.url) as http:
        folders = (await http.get("/models")).json()
        assert folders[:3] == ["checkpoints", "configs", "loras"]
        assert folders[-1] == "audio_encoders" and "latent_upscale_models" not in folders
        missing = await http.get("/models/nonexistent")
        assert (missing.status_code, missing.content) == (404, b"")
        assert "content-type" not in missing.headers
        as_list = await http.post("/prompt", json=[1, 2])
        assert as_list.status_code == 400 and as_list.json()["error"]["type"] == "no_prompt"
        assert (await http.post("/prompt", json={"prompt": [1]})).status_code == 500
        image = {"1": {"class_type": "LoadImage", "inputs": {"image": "no-such.png"}},
                 "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}}}
        bad = (await http.post("/prompt", json={"prompt": image})).json()
        assert bad["node_errors"]["1"]["errors"][0]["extra_info"] == {"input_name": "image"}

        async def upload(name: str, data: bytes, **form: str) -> httpx.Response:
            return await http.post("/upload/image", files={"image": (name, data, "image/png")},
                                   data=form)

        assert (await upload("x.png", b"one", type="bogus")).status_code == 500
        assert (await upload("", b"one")).status_code == 500
        assert (await upload("x.png", b"one")).json()["name"] == "x.png"
        assert (await upload("x.png", b"two", overwrite="TRUE")).json()["name"] == "x (1).png"
        assert (await upload("x.png", b"three", overwrite="1")).json()["name"] == "x.png"
    assert (fake_comfy.dirs["input"] / "x.png").read_bytes() == b"three"


async def test_the_body_limit_counts_the_bytes_read_not_content_length(
    fake_comfy_factory,
) -> None:
    """A chunked body has no Content-Length to trust: the limit is on what arrives."""
    limit = 64 * 1024
    fake = await fake_comfy_factory(max_upload_size=limit)
    boundary = "fakeboundary"

    def multipart(data: bytes) -> bytes:
        return (f'--{boundary}\r\nContent-Disposition: form-data; name="image"; '
                f'filename="big.png"\r\nContent-Type: image/png\r\n\r\n').encode() + data + (
                    f"\r\n--{boundary}--\r\n".encode())

    async def chunked(body: bytes):
        for start in range(0, len(body), 8192):
            yield body[start:start + 8192]

    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    async with httpx.AsyncClient(base_url=fake.url) as http:
        over = multipart(b"x" * limit)
        refused = await http.post("/upload/image", content=chunked(over), headers=headers)
        assert "content-length" not in refused.request.headers
        assert (refused.status_code, refused.text) == (
            413, f"Maximum request body size {limit} exceeded.")
        big_prompt = json.dumps({"prompt": PROMPT, "pad": "y" * limit}).encode()
        refused = await http.post("/prompt", content=chunked(big_prompt))
        assert refused.status_code == 413
        body = multipart(b"x" * 1000)
        accepted = await http.post("/upload/image", content=chunked(body), headers=headers)
        assert accepted.status_code == 200 and accepted.json()["name"] == "big.png"
    assert [u["size"] for u in fake.uploads] == [1000]



async def test_held_requests_wait_and_a_gone_client_is_never_handled(
    fake_comfy: FakeComfyUI,
) -> None:
    """`hold` stops a client at a chosen request; when the client died meanwhile, the
    request is dropped unread, as one that never arrived (nothing posted)."""
    body = {"prompt": {
        "1": {"class_type": "EmptyImage",
              "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "h"}},
    }}
    fake_comfy.hold("/prompt", method="POST")
    async with aiohttp.ClientSession() as session:
        gone = asyncio.create_task(session.post(f"{fake_comfy.url}/prompt", json=body))
        while fake_comfy.held["POST /prompt"] < 1:
            await asyncio.sleep(0.01)
        gone.cancel()  # the client goes away while its request waits
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        waiting = asyncio.create_task(session.post(f"{fake_comfy.url}/prompt", json=body))
        while fake_comfy.held["POST /prompt"] < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert not waiting.done()
        fake_comfy.release("/prompt", method="POST")
        async with await waiting as answer:
            assert answer.status == 200
    assert len(fake_comfy.prompts) == 1  # the one whose client still waited


def _sd15(seed: int, steps: int = 2, size: int = 64) -> dict[str, Any]:
    """An SD 1.5 text-to-image graph as ComfyUI's default workflow builds it."""
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage",
              "inputs": {"width": size, "height": size, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {
            "seed": seed, "steps": steps, "cfg": 7.0, "sampler_name": "euler",
            "scheduler": "normal", "denoise": 1.0, "model": ["4", 0], "positive": ["6", 0],
            "negative": ["7", 0], "latent_image": ["5", 0]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "x"}},
    }


async def test_the_same_prompt_is_answered_from_the_cache_and_a_new_seed_runs(
    fake_comfy: FakeComfyUI,
) -> None:
    ws_url = fake_comfy.url.replace("http", "ws") + "/ws?clientId=c"
    async with connect(ws_url) as ws, httpx.AsyncClient(base_url=fake_comfy.url) as http:
        await ws.recv()

        async def run(prompt: dict[str, Any]) -> list[Any]:
            body = {"prompt": prompt, "client_id": "c"}
            pid = (await http.post("/prompt", json=body)).json()["prompt_id"]
            return [f for f in await _until_done(ws, pid) if isinstance(f, dict)]

        first = await run(_sd15(seed=1))
        assert _kinds(first).count("progress") == 2
        again = await run(_sd15(seed=1))
        cached = next(f for f in again if f["type"] == "execution_cached")
        # in the prompt's order, as the real one iterates it
        assert cached["data"]["nodes"] == ["4", "6", "7", "5", "3", "8", "9"]
        assert "progress" not in _kinds(again)
        assert [f["data"]["node"] for f in again if f["type"] == "executing"] == [None]
        saved = [f["data"]["output"]["images"] for f in again if f["type"] == "executed"]
        assert saved == [[{"filename": "x_00001_.png", "subfolder": "", "type": "output"}]]

        new_seed = await run(_sd15(seed=2))
        cached = next(f for f in new_seed if f["type"] == "execution_cached")
        assert sorted(cached["data"]["nodes"]) == ["4", "5", "6", "7"]  # loaders stay warm
        assert _kinds(new_seed).count("progress") == 2
        ran = [f["data"]["node"] for f in new_seed if f["type"] == "executing"]
        assert ran == ["3", "8", "9", None]


async def test_a_step_costs_more_with_more_pixels_and_frames(fake_comfy_factory) -> None:
    fake = await fake_comfy_factory(cache=False)
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    fake._sleep = record  # type: ignore[method-assign]
    async with httpx.AsyncClient(base_url=fake.url) as http:
        async def sampler_time(prompt: dict[str, Any]) -> float:
            waits.clear()
            pid = (await http.post("/prompt", json={"prompt": prompt})).json()["prompt_id"]
            while not (await http.get(f"/history/{pid}")).json():
                await asyncio.sleep(0.01)
            return sum(waits)

        small = await sampler_time(_sd15(seed=1, steps=2, size=512))
        more_steps = await sampler_time(_sd15(seed=1, steps=8, size=512))
        bigger = await sampler_time(_sd15(seed=1, steps=2, size=1024))
        video = _sd15(seed=1, steps=2, size=512)
        video["5"] = {"class_type": "EmptyHunyuanLatentVideo",
                      "inputs": {"width": 512, "height": 512, "length": 9, "batch_size": 1}}
        frames = await sampler_time(video)
    assert small > 0
    assert more_steps == pytest.approx(4 * small)
    assert bigger == pytest.approx(4 * small)
    assert frames == pytest.approx(9 * small)


async def test_a_prompt_waits_pending_until_the_running_one_ends(fake_comfy_factory) -> None:
    fake = await fake_comfy_factory(step_delay=0.5)
    ws_url = fake.url.replace("http", "ws") + "/ws?clientId=q"
    async with connect(ws_url) as ws, httpx.AsyncClient(base_url=fake.url) as http:
        await ws.recv()
        body = {"prompt": _sd15(seed=1, steps=50), "client_id": "q"}
        first = (await http.post("/prompt", json=body)).json()["prompt_id"]
        body = {"prompt": _sd15(seed=2, steps=1), "client_id": "q"}
        second = (await http.post("/prompt", json=body)).json()["prompt_id"]
        seen: list[Any] = []
        while not (seen and seen[-1]["type"] == "progress"):
            raw = await asyncio.wait_for(ws.recv(), 5)
            if isinstance(raw, str):
                seen.append(json.loads(raw))
        queue = (await http.get("/queue")).json()
        assert [item[1] for item in queue["queue_running"]] == [first]
        assert [item[1] for item in queue["queue_pending"]] == [second]
        started = [f["data"]["prompt_id"] for f in seen if f["type"] == "execution_start"]
        assert started == [first]  # the waiting one has not started
        await http.post("/interrupt", json={"prompt_id": first})
        rest = [f for f in await _until_done(ws, second) if isinstance(f, dict)]
    order = [(f["type"], f["data"].get("prompt_id")) for f in rest
             if f["type"] in ("execution_interrupted", "execution_start")]
    assert order == [("execution_interrupted", first), ("execution_start", second)]


async def test_a_model_file_added_is_listed_and_accepted_at_once(fake_comfy_factory) -> None:
    fake = await fake_comfy_factory(models={"checkpoints": ["old.safetensors"]})
    prompt = _sd15(seed=1)
    prompt["4"]["inputs"]["ckpt_name"] = "new.safetensors"
    async with httpx.AsyncClient(base_url=fake.url) as http:
        async def listed() -> list[str]:
            info = (await http.get("/object_info/CheckpointLoaderSimple")).json()
            return list(info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0])

        assert await listed() == ["old.safetensors"]
        assert (await http.post("/prompt", json={"prompt": prompt})).status_code == 400
        fake.add_model("checkpoints", "new.safetensors")
        assert "new.safetensors" in await listed()
        everything = (await http.get("/object_info")).json()
        assert "new.safetensors" in everything["CheckpointLoaderSimple"]["input"]["required"][
            "ckpt_name"][0]
        assert "new.safetensors" in (await http.get("/models/checkpoints")).json()
        assert (await http.post("/prompt", json={"prompt": prompt})).status_code == 200
        fake.remove_model("checkpoints", "new.safetensors")
        assert "new.safetensors" not in await listed()


async def test_a_partition_leaves_no_connection_through_not_even_one_accepted_before_it(
    fake_comfy: FakeComfyUI,
) -> None:
    """A connection the server accepted just before the partition, whose request it reads
    after, is cut as every other: under load a worker got a whole run through one."""
    reader, writer = await asyncio.open_connection("127.0.0.1", fake_comfy.port)
    try:
        await asyncio.sleep(0.1)  # accepted: the kernel and the server both hold it
        await fake_comfy.partition()
        writer.write(b"GET /queue HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        try:
            answer = await asyncio.wait_for(reader.read(1024), 5)
        except ConnectionError:
            answer = b""
        assert answer == b"", answer  # no answer: the connection is reset
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", fake_comfy.port)
    finally:
        writer.close()
    await fake_comfy.heal()
    async with aiohttp.ClientSession() as session, session.get(f"{fake_comfy.url}/queue") as r:
        assert r.status == 200
