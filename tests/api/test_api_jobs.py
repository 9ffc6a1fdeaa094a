"""The jobs API: a video from submit to download on the fake ComfyUI, its event stream read
to the end, a cancel mid-run that withdraws the prompt from the GPU, a restart of the
server mid-stream that loses nothing, and refusals in the desk's own sentences."""

from __future__ import annotations

import base64
import io
import logging
import uuid

import aiohttp
import av
from PIL import Image

from comfyveil import images
from comfyveil.api import job_events
from comfyveil.store import jobs
from tests.api.jobs_support import Event, events, stack
from tests.web.support import wait_for

PROMPT = "a heron lands on a misty lake"
WAN = {"steps": 3, "ar": "16:9", "length": 5}


def session(key: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"})


async def read_all(api: aiohttp.ClientSession, url: str, last: str | None = None) -> list[Event]:
    return [e async for e in events(api, url, last)]


async def test_a_video_from_submit_to_download_with_its_stream_read_to_the_end(
    db, fake_comfy, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    async with stack(db, [fake_comfy]) as s:
        key, _user = await s.key()
        async with session(key) as api:
            body = {"command": "wan", "prompt": PROMPT, "options": WAN}
            headers = {"Idempotency-Key": "clip-1"}
            async with api.post(s.url + "/v1/jobs", json=body, headers=headers) as r:
                assert r.status == 202, await r.text()
                job = await r.json()
                assert r.headers["Location"] == f"/v1/jobs/{job['id']}"
            assert job["object"] == "job" and job["command"] == "wan"
            assert job["state"] in ("queued", "waiting", "running")
            assert isinstance(job["seed"], int) and job["outputs"] == []
            # the SDK-style retry of the same request is the same job, not a second one
            async with api.post(s.url + "/v1/jobs", json=body, headers=headers) as r:
                assert r.status == 202 and (await r.json())["id"] == job["id"]
            assert await s.job_count() == 1

            seen = await read_all(api, f"{s.url}/v1/jobs/{job['id']}/events")
            states = [e.data["state"] for e in seen if e.event == "state"]
            assert states[0] == "queued" and states[-1] == "succeeded"
            final = seen[-1]
            assert final.event == "job" and final.data["state"] == "succeeded"
            ids = [tuple(int(p) for p in e.id.split(".")) for e in seen]
            assert ids == sorted(ids) and len(set(ids)) == len(ids)  # ids only grow

            async with api.get(f"{s.url}/v1/jobs/{job['id']}") as r:
                done = await r.json()
            assert done == final.data
            assert done["progress"]["percent"] == 100.0 and done["error"] is None
            assert done["started_at"] and done["finished_at"]
            (out,) = done["outputs"]
            assert out["type"] == "video" and out["content_type"] == "video/mp4"
            async with api.get(s.url + out["url"]) as r:
                assert r.status == 200 and r.content_type == "video/mp4"
                assert r.headers["Content-Disposition"].startswith('attachment; filename="')
                assert r.headers["Content-Disposition"].endswith('.mp4"')
                data = await r.read()
            assert len(data) == out["size"] and images.sniff_mime(data) == "video/mp4"
            # a real MP4 a player opens: 5 frames of Wan's latent make 2 of 848x480
            with av.open(io.BytesIO(data)) as video:
                frames = [(f.width, f.height) for f in video.decode(video=0)]
                tags = dict(video.metadata)
            assert frames == [(848, 480)] * 2
            # the prompt and workflow ComfyUI wrote into the file's tags are gone
            assert not {"prompt", "workflow", "comment"} & tags.keys()
            assert PROMPT.encode() not in data and b"CLIPTextEncode" not in data
            # the options as the chat reads them: 16:9 near the workflow's own 640x640
            row = await db.jobs.get(uuid.UUID(job["id"]))
            assert row is not None
            assert (row.params["width"], row.params["height"]) == (848, 480)
            assert row.params["steps"] == 3 and row.params["length"] == 5

            async with api.get(f"{s.url}/v1/jobs/{job['id']}/outputs/1") as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "output_not_found"
    assert PROMPT not in caplog.text and key not in caplog.text


async def test_cancel_mid_run_withdraws_the_prompt_and_a_finished_job_is_forgotten(
    db, fake_comfy_factory
) -> None:
    comfy = await fake_comfy_factory(step_delay=0.5)
    async with stack(db, [comfy]) as s:
        key, user = await s.key()
        async with session(key) as api:
            body = {"command": "wan", "prompt": PROMPT, "options": {**WAN, "steps": 12}}
            async with api.post(s.url + "/v1/jobs", json=body) as r:
                job = await r.json()
            url = f"{s.url}/v1/jobs/{job['id']}"
            seen: list[Event] = []
            async for event in events(api, url + "/events"):
                seen.append(event)
                step = event.data.get("progress", {}).get("step") or 0
                if event.event == "job" and step >= 1 and not comfy.interrupts:
                    async with api.delete(url) as r:  # mid-run: a sampler's first step
                        assert r.status == 200 and (await r.json())["state"] == "running"
                    await wait_for(lambda: _true(bool(comfy.interrupts)))
            assert seen[-1].event == "job" and seen[-1].data["state"] == "cancelled"
            assert "running" in [e.data["state"] for e in seen]
            assert comfy.interrupts, "the prompt was withdrawn from the GPU"
            # forgetting it: its files and history go, and it is no longer there
            async with api.delete(url) as r:
                assert (await r.json()) == {
                    "id": job["id"],
                    "object": "job.deleted",
                    "deleted": True,
                }
            async with api.get(url) as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "job_not_found"
            assert await db.jobs.list_for_user(user) == []


async def test_a_restart_of_the_server_mid_stream_loses_nothing(db, fake_comfy_factory) -> None:
    comfy = await fake_comfy_factory(step_delay=0.3)
    async with stack(db, [comfy]) as s:
        key, _user = await s.key()
        async with session(key) as api:
            body = {"command": "wan", "prompt": PROMPT, "options": {**WAN, "steps": 6}}
            async with api.post(s.url + "/v1/jobs", json=body) as r:
                job = await r.json()
            path = f"/v1/jobs/{job['id']}/events"
            before: list[Event] = []
            async for event in events(api, s.url + path):
                before.append(event)
                if event.event == "job" and event.data["state"] == "running":
                    break  # the client goes away mid-run
            await s.restart()  # the job goes on on the GPU meanwhile
            after = await read_all(api, s.url + path, last=before[-1].id)
            assert after[-1].data["state"] == "succeeded"
            states = [e.data["state"] for e in before + after if e.event == "state"]
            assert states[0] == "queued" and states[-1] == "succeeded"
            history = await db.jobs.events(uuid.UUID(job["id"]))
            # every entry of the job's history came once, across the two connections
            assert [e.id.split(".")[0] for e in before + after if e.event == "state"] == [
                str(h.id) for h in history
            ]


async def test_the_stream_ends_when_the_job_ends_while_it_gathers_news(
    db, fake_comfy, monkeypatch
) -> None:
    # news of a job going on waits to be read (with the next), as long as this test
    # lasts: its end is read at once all the same, with every entry before it
    monkeypatch.setattr(job_events, "SETTLE", 3600.0)
    async with stack(db, [fake_comfy], worker=False) as s:
        key, _user = await s.key()
        async with session(key) as api:
            body = {"command": "f", "prompt": PROMPT}
            async with api.post(s.url + "/v1/jobs", json=body) as r:
                job = await r.json()
            seen: list[Event] = []
            stream = events(api, f"{s.url}/v1/jobs/{job['id']}/events")
            async for event in stream:
                seen.append(event)
                if event.event == "job":
                    break  # the first read told the job, queued
            claimed = await db.jobs.claim("worker-test")
            assert claimed is not None
            claimed = await db.jobs.mark_submitted(claimed, "gpu0")
            await db.jobs.complete(claimed, [])
            seen += [e async for e in stream]
            states = [e.data["state"] for e in seen if e.event == "state"]
            assert states == ["queued", "waiting", "running", "succeeded"]
            assert seen[-1].event == "job" and seen[-1].data["state"] == "succeeded"


async def _true(value: bool) -> bool:
    return value


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


async def test_an_edit_with_a_data_url_and_with_a_multipart_part(db, fake_comfy) -> None:
    async with stack(db, [fake_comfy]) as s:
        key, _user = await s.key()
        async with session(key) as api:
            url = "data:image/png;base64," + base64.b64encode(png()).decode()
            body = {"command": "qwen", "prompt": "add a hat", "images": [url]}
            async with api.post(s.url + "/v1/jobs", json=body) as r:
                assert r.status == 202, await r.text()
                first = await r.json()
            form = aiohttp.FormData()
            form.add_field("command", "qwen")
            form.add_field("prompt", "add a scarf")
            form.add_field("options", '{"steps": 4}')
            form.add_field("images", png(), filename="in.png", content_type="image/png")
            async with api.post(s.url + "/v1/jobs", data=form) as r:
                assert r.status == 202, await r.text()
                second = await r.json()
            for job in (first, second):
                seen = await read_all(api, f"{s.url}/v1/jobs/{job['id']}/events")
                assert seen[-1].data["state"] == "succeeded"
                assert seen[-1].data["outputs"][0]["content_type"] == "image/png"
            # the account's jobs, newest first, a page at a time
            async with api.get(s.url + "/v1/jobs?limit=1") as r:
                page = await r.json()
            assert [j["id"] for j in page["data"]] == [second["id"]] and page["has_more"]
            async with api.get(s.url + f"/v1/jobs?limit=1&after={page['next_cursor']}") as r:
                rest = await r.json()
            assert [j["id"] for j in rest["data"]] == [first["id"]]
            assert not rest["has_more"] and rest["next_cursor"] is None


async def test_refusals_are_the_desks_sentences_and_queue_nothing(db, fake_comfy) -> None:
    async with stack(db, [fake_comfy], worker=False) as s:
        key, _user = await s.key()
        other, _ = await s.key("otto")
        async with session(key) as api:

            async def refused(body: object, status: int = 400) -> dict:
                async with api.post(s.url + "/v1/jobs", json=body) as r:
                    answer = await r.json()
                    assert r.status == status, answer
                    assert "Traceback" not in str(answer)
                    return answer["error"]

            error = await refused({"command": "wan", "prompt": PROMPT, "options": {"steps": 99}})
            assert error["param"] == "steps" and "between 3 and 12" in error["message"]
            error = await refused({"command": "wan", "prompt": PROMPT, "options": {"stepz": 4}})
            assert "unknown option" in error["message"].lower()
            error = await refused({"command": "wan", "prompt": PROMPT, "options": {"ar": "9:1"}})
            assert error["param"] == "ar" and "too extreme" in error["message"]
            error = await refused({"command": "wan", "prompt": ""})
            assert error["param"] == "prompt"
            error = await refused({"command": "qwen", "prompt": "a hat"})
            assert error["param"] == "images" and "takes 1 image" in error["message"]
            error = await refused({"command": "sdxl", "prompt": PROMPT}, 404)
            assert error["code"] == "command_not_found"
            error = await refused({"command": "f", "images": ["http://x/y.png"]})
            assert error["param"] == "images"
            not_an_image = "data:image/png;base64," + base64.b64encode(b"%PDF-1.7").decode()
            error = await refused({"command": "qwen", "prompt": "a hat", "images": [not_an_image]})
            assert error["param"] == "images" and "image" in error["message"], error
            for body in ([], {"prompt": PROMPT}, {"command": "f", "options": [1]}):
                await refused(body)
            form = aiohttp.FormData()  # a part past its limit: refused, read no further
            form.add_field("command", "f")
            form.add_field("prompt", "a" * (64 * 1024 + 1), content_type="text/plain")
            async with api.post(s.url + "/v1/jobs", data=form) as r:
                answer = await r.json()
                assert r.status == 413 and answer["error"]["param"] == "prompt", answer
                assert answer["error"]["message"] == "That upload is too large."
            async with api.get(s.url + "/v1/jobs?after=nonsense") as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == "after"
            assert await s.job_count() == 0
            async with api.post(s.url + "/v1/jobs", json={"command": "f", "prompt": "x"}) as r:
                job = await r.json()
            async with api.get(f"{s.url}/v1/jobs/{job['id']}/outputs/0") as r:  # not yet made
                assert (await r.json())["error"]["code"] == "output_not_found"
        async with session(other) as stranger:  # another account's job is not there
            for method, path in (
                ("GET", ""),
                ("DELETE", ""),
                ("GET", "/outputs/0"),
                ("GET", "/events"),
            ):
                async with stranger.request(method, f"{s.url}/v1/jobs/{job['id']}{path}") as r:
                    assert r.status == 404
                    assert (await r.json())["error"]["code"] == "job_not_found"
            async with stranger.get(s.url + "/v1/jobs") as r:
                assert (await r.json())["data"] == []
        assert (await db.jobs.get(uuid.UUID(job["id"]))).status is (jobs.Status.QUEUED)
