"""A compromised or broken GPU host costs a bounded amount of time and memory (issue 11 §1).

Each test switches on one misbehaviour of the tampering fake (tests/fakes/tampering.py)
and runs the real client path (`comfy.execute`, as the worker and `generate` do) against
it: the job ends within its deadline (plus slack), reads no more than its caps, and the
message says what happened.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from comfyveil.comfy import client as comfy_client
from comfyveil.comfy import (
    downloads,
    errors,
    events,
    execute,
    limits,
    results,
    transport,
    uploads,
    workflow,
    ws,
)
from tests.fakes.tampering import TamperingComfyUI

MIB = 1 << 20
SLACK = 10.0  # seconds past the job's deadline the issue allows

Tamper = Callable[..., Awaitable[TamperingComfyUI]]


@pytest.fixture
async def tamper(tmp_path: Path) -> AsyncIterator[Tamper]:
    started: list[TamperingComfyUI] = []

    async def make(**kwargs: Any) -> TamperingComfyUI:
        kwargs.setdefault("root", tmp_path / f"comfyui-{len(started)}")
        fake = TamperingComfyUI(**kwargs)
        await fake.start()
        started.append(fake)
        return fake

    yield make
    for fake in started:
        await fake.stop()


def flux() -> tuple[workflow.Workflow, dict[str, object]]:
    wf = workflow.find("f")
    return wf, wf.validate({"prompt": "a red fox", "steps": 1, "width": 256, "height": 256})


def client_for(fake: TamperingComfyUI, **kwargs: Any) -> comfy_client.ComfyClient:
    kwargs.setdefault("name", "gpu0")
    kwargs.setdefault("poll_interval", 0.1)
    return comfy_client.ComfyClient(fake.url, **kwargs)


async def timed(awaitable: Awaitable[Any]) -> tuple[BaseException | None, float]:
    """What the awaitable raised (None if nothing) and how long it took; bounded, so a
    regression fails instead of hanging."""
    started = time.monotonic()
    try:
        await asyncio.wait_for(awaitable, 60)
    except TimeoutError:
        pytest.fail("still running after 60 s")
    except Exception as exc:
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


def connections_to(port: int) -> int:
    """Open TCP connections of this process's network namespace to 127.0.0.1:`port`."""
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    wanted = f"0100007F:{port:04X}"
    return sum(1 for line in lines if line.split()[2] == wanted and line.split()[3] == "01")


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), "red").save(buffer, "PNG")
    return buffer.getvalue()


# --- downloads ---------------------------------------------------------------------------


async def test_a_damaged_file_is_one_plain_permanent_failure(tamper: Tamper) -> None:
    # Cut inside a chunk after the prompt's text chunk: its metadata cannot be told
    # from its pixels, so it must not reach the user as it came (issue 22 §10).
    whole = png(64, 64)
    crafted = whole[:33] + b"\x00\x00\x00\x20tEXtprompt\x00my secret prompt" + whole[33:60]
    fake = await tamper(view_body=crafted)
    wf, values = flux()
    async with client_for(fake) as client:
        error, _ = await timed(execute.execute(client, wf, values, timeout=30))
    assert isinstance(error, errors.OutputDamaged), error
    assert str(error) == "backend gpu0 sent a damaged file"
    assert error.transient is False  # the same backend would send the same file again



async def test_an_endless_file_is_cut_at_max_output_bytes(tamper: Tamper) -> None:
    fake = await tamper(endless_view=True)
    wf, values = flux()
    async with client_for(fake, limits=limits.Limits(max_output_bytes=8 * MIB)) as client:
        error, took = await timed(execute.execute(client, wf, values, timeout=30))
    assert isinstance(error, errors.OutputTooLarge), error
    assert str(error) == "backend gpu0 sent a file larger than 8 MiB"
    assert error.transient is False
    assert took < 10
    # it stopped reading at the cap: what left the server is the cap plus what the
    # sockets' buffers held, not the seconds' worth of an endless stream
    assert fake.view_bytes_sent < 8 * MIB + 16 * MIB


async def test_files_of_one_job_together_stay_within_max_output_bytes(tamper: Tamper) -> None:
    fake = await tamper(output_names=[f"out{i}.png" for i in range(4)])
    wf, values = flux()
    async with client_for(fake) as client:
        done = await execute.execute(client, wf, values, timeout=30)
        size = len(done.files[0].data)
        assert len(done.files) == 4
        tight = limits.Limits(max_output_bytes=3 * size)
        async with client_for(fake, limits=tight) as capped:
            run = await capped.follow(done.result.prompt_id)
            with pytest.raises(errors.OutputTooLarge) as info:
                await downloads.download_outputs(capped, run)
    cap = limits.size_text(3 * size)
    assert str(info.value) == f"backend gpu0 sent more than {cap} of files for one job"


async def test_a_trickling_file_ends_with_the_jobs_deadline(tamper: Tamper) -> None:
    fake = await tamper(trickle_view=True, trickle_interval=10)
    wf, values = flux()
    async with client_for(fake) as client:
        error, took = await timed(execute.execute(client, wf, values, timeout=2))
    assert isinstance(error, execute.JobTimedOut), error
    assert str(error) == (
        "backend gpu0 was too slow sending the results; the job was stopped after 2 s"
    )
    assert "cannot be reached" not in str(error)
    assert took < 2 + SLACK
    assert fake.misbehaving.is_set()


async def test_a_silent_download_fails_by_inactivity_without_a_deadline(tamper: Tamper) -> None:
    fake = await tamper(trickle_view=True, trickle_interval=10)
    wf, values = flux()
    async with client_for(fake) as client:
        run = await client.run(wf.apply(values))
    async with client_for(fake, timeout=0.5) as client:
        error, took = await timed(client.download(run.outputs[0]))
    assert isinstance(error, errors.BackendStopped), error
    assert str(error) == "backend gpu0 stopped answering while sending a file"
    assert took < 5


async def test_many_listed_outputs_fail_before_any_download(tamper: Tamper) -> None:
    fake = await tamper(listed_outputs=20_000)
    wf, values = flux()
    async with client_for(fake) as client:
        error, took = await timed(execute.execute(client, wf, values, timeout=30))
    assert isinstance(error, errors.TooManyOutputs), error
    assert str(error) == "backend gpu0 listed 20000 files for one job, more than the 64 allowed"
    assert not [r for r in fake.requests if r.path.endswith("/view")]
    assert took < 10


# --- uploads -----------------------------------------------------------------------------


async def test_a_stalled_upload_ends_with_the_jobs_deadline(tamper: Tamper) -> None:
    fake = await tamper(stall_upload=True)
    wf = workflow.find("qwen")
    image = uploads.InputImage(png(64, 64))
    values = wf.validate({"prompt": "a hat", "steps": 1, "image": image.upload_name})
    async with client_for(fake) as client:
        error, took = await timed(
            execute.execute(client, wf, values, {"image": image}, timeout=2)
        )
    assert isinstance(error, errors.BackendStopped), error
    assert str(error) == "backend gpu0 stopped answering during the upload"
    assert took < 2 + SLACK
    assert fake.uploads_stalled == 1 and fake.prompts == []


async def test_a_backend_that_stops_reading_an_upload_fails_it(tamper: Tamper) -> None:
    """No deadline at all: the write itself times out when nothing leaves for `timeout`
    (aiohttp has no write timeout; the socket buffers fill, then nothing moves)."""
    fake = await tamper(stall_upload=True)
    big = bytes(64 * MIB)  # more than the sockets' buffers on both sides hold
    sent: list[int] = []
    async with client_for(fake, timeout=1) as client:
        error, took = await timed(client.upload_image(big, "x.png", on_sent=sent.append))
        await asyncio.sleep(0.2)
        # aborted, not closed: a close would wait for the unsent bytes, forever
        assert connections_to(fake.port) == 0
    assert isinstance(error, errors.BackendStopped), error
    assert str(error) == "backend gpu0 stopped answering during the upload"
    assert 0 < sum(sent) < len(big)
    assert took < 10


# --- the WebSocket -----------------------------------------------------------------------


async def test_a_huge_text_message_is_refused_from_its_header(tamper: Tamper) -> None:
    size = 300 * MIB
    fake = await tamper(huge_ws_text=size)
    wf, values = flux()
    async with client_for(fake) as client:
        done, took = await timed(execute.execute(client, wf, values, timeout=20))
    assert done is None  # the job itself went on: followed by polling once the socket closed
    assert fake.misbehaving.is_set()
    # refused at the frame's header: the client read at most what sockets buffer
    assert fake.huge_text_sent < 32 * MIB
    assert took < 20


async def test_binary_frames_may_be_as_large_as_an_output(tamper: Tamper) -> None:
    """A SaveImageWebsocket image comes as one binary frame: over the text cap, within
    max_output_bytes, it is read."""
    fake = await tamper()
    big = bytes(limits.WS_TEXT_BYTES + MIB)
    async with client_for(fake) as client:
        socket = await client._open_socket()
        queue = socket.listen("p1")
        socket.current_prompt = "p1"
        await fake._send_bytes(b"\x00\x00\x00\x01\x00\x00\x00\x02" + big, None)
        event: Any = None
        while not isinstance(event, events.Preview):
            item = await asyncio.wait_for(queue.get(), 10)
            assert item is not ws.LOST, "the socket was closed"
            _, event = item
    assert len(event.image) == len(big)


# --- JSON answers ------------------------------------------------------------------------


async def test_an_endless_json_answer_is_cut_at_its_cap(tamper: Tamper) -> None:
    fake = await tamper(endless_json=["/queue"])
    async with client_for(fake) as client:
        error, took = await timed(client.queue())
    assert isinstance(error, errors.AnswerTooLarge), error
    assert str(error) == "backend gpu0 sent an answer to GET /queue larger than 16 MiB"
    assert took < 10
    assert fake.misbehaving.is_set()


async def test_a_trickling_json_answer_has_a_deadline(tamper: Tamper) -> None:
    fake = await tamper(trickle_json=["/object_info"], trickle_interval=0.2)
    async with client_for(fake, timeout=0.5) as client:
        error, took = await timed(client.object_info())
    assert isinstance(error, errors.BackendStopped), error
    deadline = 0.5 * transport.ANSWER_DEADLINE
    assert str(error) == f"backend gpu0 took more than {deadline:.0f} s to answer GET /object_info"
    assert took < deadline + 3


# --- file names --------------------------------------------------------------------------


NASTY_NAMES = [
    "../../escape.png", "/etc/passwd", "..", "", ".", "sub/../../../x.png",
    "..\\..\\win.png", "a\x00b.png", "line\nbreak.png", "x" * 300 + ".png",
]


@pytest.mark.parametrize("streamed", [True, False])
async def test_output_names_from_the_server_never_leave_the_out_folder(
    tamper: Tamper, tmp_path: Path, streamed: bool
) -> None:
    names = [name for name in NASTY_NAMES if name]  # "" is not listed by ComfyUI's shape
    fake = await tamper(output_names=[*names, ("../../../outside", "sub.png")])
    wf, values = flux()
    out = tmp_path / "deep" / "out"
    (out.parent / "outside").mkdir(parents=True)
    async with client_for(fake) as client:
        done = await execute.execute(
            client, wf, values, timeout=30, out_dir=out if streamed else None
        )
    saved = downloads.save_outputs(done.files, out)
    assert len(saved) == len(names) + 1
    for path in saved:
        assert path.parent == out and path.is_file()
        assert len(path.name) <= 120
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in saved)
    assert not any((tmp_path / "deep").glob("escape*")) and not (out.parent / "x.png").exists()
    assert list((out.parent / "outside").iterdir()) == []


def test_save_outputs_never_follows_a_planted_link(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    elsewhere = tmp_path / "elsewhere.png"  # a dangling link: "exists" says no
    (out / "image.png").symlink_to(victim)
    (out / "other.png").symlink_to(elsewhere)
    files = (
        downloads.OutputData(results.OutputFile("9", "image.png", "", "output", "image"), b"a"),
        downloads.OutputData(results.OutputFile("9", "other.png", "", "output", "image"), b"b"),
    )
    saved = downloads.save_outputs(files, out)
    assert victim.read_text() == "keep me" and not elsewhere.exists()
    assert [p.name for p in saved] == ["image-1.png", "other-1.png"]
    assert [p.read_bytes() for p in saved] == [b"a", b"b"]
