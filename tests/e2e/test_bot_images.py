"""Edit workflows: the image comes from the chat's last result, a replied photo, or a
photo sent with the command; bad files are refused in one sentence."""

from __future__ import annotations

from comfyveil import config
from tests.e2e.bot_support import SMALL, png, running_bot
from tests.fakes.comfyui import FakeComfyUI
from tests.fakes.telegram import FakeTelegram
from tests.fixtures.photos import comfy_total_pixels, photo_png, size_of
from tests.integration.worker_support import sent_values


def user_uploads(fake: FakeComfyUI) -> list[dict]:
    """The inputs sent, not the 1x1 images that overwrote them after each job."""
    return [u for u in fake.uploads if not u["overwrite"]]


def last_upload(fake: FakeComfyUI) -> bytes:
    data: bytes = user_uploads(fake)[-1]["data"]
    return data


async def test_qwen_after_f_edits_the_first_result(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(20, f"/f an astronaut {SMALL}")
        await stack.result(20)
        first = (await db.jobs.list_for_user(20, limit=1))[0]
        first_output = (await db.jobs.outputs(first.id))[0].data

        stack.send(20, "/qwen put the t-shirt on the astronaut --steps 2")
        edited = await stack.result(20, count=2)
        assert edited.result["caption"].startswith("/qwen")
        assert len(user_uploads(fake_comfy)) == 1
        assert last_upload(fake_comfy) == first_output


async def test_reply_to_a_photo_edits_that_photo(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        photo_message = stack.send(21, photo=png(80, 60))
        assert "caption" in await stack.reply_text(21)  # the hint on what to do with it
        stack.send(21, "/qwen make it night --steps 2",
                   reply_to_message_id=photo_message["message_id"])
        await stack.result(21)
        largest = photo_message["photo"][-1]["file_id"]
        assert last_upload(fake_comfy) == fake_telegram.file_bytes(largest)


async def test_photo_with_the_command_as_caption(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        # Even with an earlier result in the chat, the photo sent with the command wins.
        stack.send(22, f"/f a cat {SMALL}")
        await stack.result(22)
        sent = stack.send(22, photo=png(90, 70, (10, 200, 10)),
                          caption="/qwen add a hat --steps 2")
        await stack.result(22, count=2)
        assert last_upload(fake_comfy) == fake_telegram.file_bytes(sent["photo"][-1]["file_id"])
    # The graph loads that upload, with the user's words and steps.
    job = (await db.jobs.list_for_user(22, limit=1))[0]
    graph = sent_values(fake_comfy, job.id, "qwen")
    upload = user_uploads(fake_comfy)[-1]
    where = "/".join(filter(None, (upload["subfolder"], upload["name"])))
    kind = "" if upload["type"] == "input" else f" [{upload['type']}]"  # ComfyUI's annotation
    assert graph["image"] == where + kind
    assert (graph["prompt"], graph["steps"]) == ("add a hat", 2)


async def test_a_pdf_is_refused_in_one_sentence_and_nothing_is_queued(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(23, document=(b"%PDF-1.7\n1 0 obj\n<<>>\nendobj\n", "scan.pdf",
                                 "application/pdf"), caption="/qwen make it blue")
        text = await stack.reply_text(23)
        assert text == ("That file is not an image (looks like a PDF). "
                        "Send a JPEG, PNG or WebP photo.")
        assert await stack.queued_count() == 0
        assert fake_comfy.uploads == []


async def test_an_edit_without_any_image_says_how(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(24, "/qwen make it night")
        text = await stack.reply_text(24)
        assert text.startswith("/qwen edits an image: send it as the caption of a photo")
        assert await stack.queued_count() == 0


async def test_edit_this_button_then_qwen_edits_that_result(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(25, f"/f one {SMALL} --seed 1")
        first = await stack.result(25)
        stack.send(25, f"/f two {SMALL} --seed 2")
        await stack.result(25, count=2)
        button = first.result["reply_markup"]["inline_keyboard"][0][1]
        query = fake_telegram.user_presses(25, first.result["message_id"],
                                           button["callback_data"])
        await fake_telegram.wait_for(lambda _: query in fake_telegram.callback_answers)
        assert "/qwen" in fake_telegram.callback_answers[query]["text"]
        stack.send(25, "/qwen make it night --steps 2")
        await stack.result(25, count=3)
        jobs_ = await db.jobs.list_for_user(25, limit=3)
        one = next(j for j in jobs_ if j.params.get("seed") == 1)
        assert last_upload(fake_comfy) == (await db.jobs.outputs(one.id))[0].data


async def test_send_as_file_button_sends_the_original_bytes(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(26, f"/f a lake {SMALL}")
        photo = await stack.result(26)
        button = photo.result["reply_markup"]["inline_keyboard"][0][2]
        fake_telegram.user_presses(26, photo.result["message_id"], button["callback_data"])
        document = await stack.result(26, method="sendDocument")
        job = (await db.jobs.list_for_user(26, limit=1))[0]
        assert document.files["document"][1] == (await db.jobs.outputs(job.id))[0].data


async def test_again_after_an_edit_edits_the_same_image_with_a_new_seed(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        sent = stack.send(25, photo=png(64, 48, (200, 10, 10)), caption="/qwen add a hat --steps 2")
        await stack.result(25)
        original = fake_telegram.file_bytes(sent["photo"][-1]["file_id"])
        stack.send(25, "/again")
        await stack.result(25, count=2)
        assert len(user_uploads(fake_comfy)) == 2  # the second job sent the kept image again
        assert last_upload(fake_comfy) == original
        runs = await db.jobs.list_for_user(25, limit=2)
        assert len({sent_values(fake_comfy, j.id, "qwen")["seed"] for j in runs}) == 2


async def test_image_limits_are_exact_for_a_file_sent_to_the_bot(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    """A file of exactly max_image_bytes and max_image_pixels is edited; one byte or one
    pixel more is refused in a sentence, and nothing is queued for it."""
    data = png(40, 30)
    exact = config.LimitsConfig(max_image_bytes=len(data), max_image_pixels=40 * 30)
    async with running_bot(fake_telegram, db, [fake_comfy], limits=exact) as stack:
        stack.send(27, document=(data, "in.png", "image/png"), caption="/qwen a hat --steps 2")
        await stack.result(27)
        assert last_upload(fake_comfy) == data
    for limits, refusal in (
        (config.LimitsConfig(max_image_bytes=len(data) - 1, max_image_pixels=40 * 30),
         "That file is 0.0 MB; the limit is"),
        (config.LimitsConfig(max_image_bytes=len(data), max_image_pixels=40 * 30 - 1),
         "That image is 0.0 MP; the limit is 0.0 MP."),
    ):
        async with running_bot(fake_telegram, db, [fake_comfy], limits=limits) as stack:
            before = len([c for c in fake_telegram.calls("sendMessage")
                          if str(c.params.get("chat_id")) == "28"])
            stack.send(28, document=(data, "in.png", "image/png"),
                       caption="/qwen a hat --steps 2")
            reply = await fake_telegram.wait_for_call("sendMessage", chat_id=28,
                                                      count=1 + before)
            assert str(reply.result["text"]).startswith(refusal)
    assert len(user_uploads(fake_comfy)) == 1
    assert len(await db.jobs.list_for_user(28, limit=5)) == 0


async def test_a_large_file_reaches_the_gpu_host_at_the_size_qwen_uses(
    fake_telegram: FakeTelegram, fake_comfy: FakeComfyUI, db
) -> None:
    """The workflow scales its input to --megapixels first: only that much is sent; the
    kept input (for /again) stays the user's own."""
    data = photo_png(800, 600)
    async with running_bot(fake_telegram, db, [fake_comfy]) as stack:
        stack.send(29, document=(data, "in.png", "image/png"),
                   caption="/qwen a hat --steps 2 --megapixels 0.25")
        await stack.result(29)
    sent = last_upload(fake_comfy)
    assert size_of(sent) == comfy_total_pixels(800, 600, 0.25) and len(sent) < len(data)
    job = (await db.jobs.list_for_user(29, limit=1))[0]
    assert (await db.jobs.inputs(job.id))[0].data == data
    # The result comes back once, as the PNG ComfyUI wrote, not a recompressed preview.
    views = [r for r in fake_comfy.requests if r.path.removeprefix("/api") == "/view"]
    assert len(views) == 1 and "preview" not in views[0].query
    assert (await db.jobs.outputs(job.id))[0].data.startswith(b"\x89PNG")
