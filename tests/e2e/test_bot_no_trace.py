"""Issue 12 through the bot: a photo's EXIF never reaches the database or the GPU host,
a result sent as a file carries no prompt, and /forget also cleans the GPU host."""

from __future__ import annotations

import io

from PIL import Image

from tests.e2e.bot_support import running_bot
from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.telegram import FakeTelegram
from tests.integration.worker_support import wait_for


def photo_with_gps() -> bytes:
    exif = Image.Exif()
    exif[0x010F] = "PhoneMaker"
    exif[0x8825] = {1: "N", 2: (48.0, 51.0, 24.0), 3: "E", 4: (2.0, 21.0, 3.0)}
    out = io.BytesIO()
    Image.new("RGB", (96, 64), (20, 120, 200)).save(out, "JPEG", exif=exif.tobytes())
    return out.getvalue()


def no_metadata(data: bytes) -> bool:
    with Image.open(io.BytesIO(data)) as image:
        return (
            set(image.info)
            <= {"dpi", "icc_profile", "jfif", "jfif_version", "jfif_unit", "jfif_density"}
            and not image.getexif()
        )


async def test_an_edit_sent_as_a_file_keeps_no_metadata_on_either_side(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(
            80,
            document=(photo_with_gps(), "IMG_2041.jpg", "image/jpeg"),
            caption="/qwen add a hat --steps 1 --file",
        )
        document = await stack.result(80, method="sendDocument")
        job = (await db.jobs.list_for_user(80, limit=1))[0]
        (stored,) = await db.jobs.inputs(job.id)
    assert b"PhoneMaker" not in stored.data and no_metadata(stored.data)
    (sent,) = [u for u in fake_comfy.uploads if not u["overwrite"]]
    assert b"PhoneMaker" not in sent["data"] and no_metadata(sent["data"])
    result = document.files["document"][1]
    assert b"add a hat" not in result and no_metadata(result)
    assert fake_comfy.history_entries == {}


async def test_forget_stops_and_removes_a_running_job_on_the_gpu_host(
    fake_telegram: FakeTelegram, fake_comfy_factory, db
) -> None:
    fake = await fake_comfy_factory(step_delay=0.5)
    async with running_bot(fake_telegram, db, [fake]) as stack:
        stack.send(
            81,
            document=(photo_with_gps(), "IMG_2042.jpg", "image/jpeg"),
            caption="/qwen add a hat --steps 20",
        )
        await wait_for(lambda: _true(fake.running is not None), timeout=20)
        stack.send(81, "/forget")
        ask = await fake_telegram.wait_for_call("sendMessage", chat_id=81, count=2)
        fake_telegram.user_presses(81, ask.result["message_id"], "forget:yes")

        async def gone() -> bool:
            inputs = [p for p in fake.dirs["temp"].rglob("*") if p.stat().st_size > 100]
            return not fake.history_entries and fake.running is None and not inputs

        await wait_for(gone, timeout=20)
        assert fake.interrupts  # stopped, not left to run to the end
        await wait_for(lambda: _true(not stack.bot.services.background), timeout=10)
        assert await db.traces.settled() == []


async def _true(value: bool) -> bool:
    return value
