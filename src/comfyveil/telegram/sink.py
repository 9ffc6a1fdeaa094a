"""Delivering finished jobs to Telegram (the worker's `DeliverySink` for chats).

A result is sent as a photo (a video, an animation for video workflows; a document,
uncompressed, when the user asked for files or Telegram refuses the photo) with a caption
(command, seed, time) and three buttons: re-roll, edit this, send as file. The status
message is then removed; a failed or cancelled job's status message becomes its one
sentence. The worker records the delivery (once) after `deliver` returns, with the sent
message ids that :meth:`TelegramSink.delivery_detail` hands it, so a delivery retried
after a crash is recognisable; a crash between sending and recording re-sends once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from telegram import (
    Bot,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    InputFile,
    Message,
    ReplyParameters,
)
from telegram.constants import ParseMode
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Forbidden,
    NetworkError,
    RetryAfter,
    TelegramError,
)

from comfyveil import i18n, sinks
from comfyveil import tasks as background
from comfyveil.desk import availability, language, registry
from comfyveil.i18n import N_, _, ltr
from comfyveil.store import accounts, jobs
from comfyveil.telegram import callbacks_data, render, replies, status
from comfyveil.telegram.context import Services

logger = logging.getLogger(__name__)

SINK_NAME = "telegram"
MAX_PHOTO_BYTES = 10 * 1024 * 1024  # Telegram's limit for sendPhoto
MAX_UPLOAD_BYTES = 50 * 1024 * 1024  # Telegram's limit for bots' uploads (cloud API)
PHOTO_MIMES = ("image/png", "image/jpeg", "image/webp")
SEND_AS_FILE_SETTING = "as_file"
SPOILER_SETTING = "spoiler"  # users.settings: the user's results behind a spoiler
SPOILER_KINDS = ("photo", "video", "animation")  # what Telegram can blur (has_spoiler)
DONE_MEMORY = 4096  # delivered jobs remembered, so a second delivery does nothing
# Bad Request descriptions that mean the chat cannot get the result (it is gone, or the bot
# may not write there); a Forbidden (blocked, kicked, deleted group) always means that.
CHAT_GONE = ("chat not found", "peer_id_invalid", "user not found", "chat_write_forbidden",
             "not enough rights", "have no rights", "group chat was deactivated")


def chat_gone(exc: BadRequest) -> bool:
    """Whether Telegram's Bad Request says the chat cannot get messages from the bot."""
    return any(gone in exc.message.lower() for gone in CHAT_GONE)


REROLL_BUTTON = N_("🎲 Re-roll")  # translated where the buttons are made
EDIT_BUTTON = N_("✏️ Edit this")
FILE_BUTTON = N_("📄 As file")


def result_buttons(
    job_id: str, index: int, *, reroll: bool = True, edit: bool = True, as_file: bool = True
) -> InlineKeyboardMarkup | None:
    """The buttons under a result, those that fit it: re-roll (a workflow with a seed, so
    another run differs), edit this (some command edits an image with words), as file
    (not for a result that is a file already)."""
    row = []
    if reroll:
        row.append(InlineKeyboardButton(_(REROLL_BUTTON),
                                        callback_data=callbacks_data.again(job_id)))
    if edit:
        row.append(InlineKeyboardButton(_(EDIT_BUTTON),
                                        callback_data=callbacks_data.edit(job_id, index)))
    if as_file:
        row.append(InlineKeyboardButton(_(FILE_BUTTON),
                                        callback_data=callbacks_data.as_file(job_id, index)))
    return InlineKeyboardMarkup([row]) if row else None


def seeded(job: jobs.Job) -> bool:
    """Whether the job's workflow takes a seed (validated values always carry it then)."""
    return "seed" in job.params


def caption_for(job: jobs.Job, *, asked_by: str | None = None) -> str:
    elapsed = waited = None
    # It ran from ComfyUI's start of the prompt; the wait before (our queue, a free GPU,
    # the GPU's own queue) is waiting. Runs recorded before that start was: from the claim.
    began = job.executing_at or job.started_at
    if began is not None and job.finished_at is not None:
        elapsed = max(0.0, (job.finished_at - began).total_seconds())
    if began is not None:
        waited = max(0.0, (began - job.created_at).total_seconds())
    seed = job.params.get("seed")
    prompt = job.params.get("prompt")
    view = render.JobView(
        id=str(job.id), command=job.command, status="succeeded",
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
        elapsed_s=elapsed, waited_s=waited,
    )
    return render.caption(view, prompt=prompt if isinstance(prompt, str) else None,
                          asked_by=asked_by)


def _reply(message_id: int | None) -> ReplyParameters | None:
    """Answer the message that asked (still sent if the user deleted it meanwhile)."""
    if message_id is None:
        return None
    return ReplyParameters(message_id, allow_sending_without_reply=True)


def _kind(output: jobs.Output) -> str:
    mime = output.mime.lower()
    if mime == "image/gif" or output.kind in ("gif", "animation"):
        return "animation"
    if mime.startswith("video/") or output.kind == "video":
        return "video"
    if mime in PHOTO_MIMES and output.size <= MAX_PHOTO_BYTES:
        return "photo"
    return "document"


async def send_output(
    bot: Bot, chat_id: int, job: jobs.Job, output: jobs.Output, *, as_file: bool,
    caption: str, reply_to: int | None = None, can_edit: bool = True,
    spoiler: bool = False,
) -> Message:
    """Send one output; a photo Telegram refuses (too large, odd shape) goes as a file.
    With `spoiler`, a photo, video or animation is blurred until tapped (a document
    cannot be)."""
    if output.size > MAX_UPLOAD_BYTES:
        return await bot.send_message(
            chat_id, replies.esc(
                _("The result is {size} MB, more than Telegram lets a bot send.").format(
                    size=ltr(output.size // (1024 * 1024)))
            ), parse_mode=ParseMode.HTML,
        )
    kind = "document" if as_file else _kind(output)
    is_image = output.mime.lower().startswith("image/")

    def buttons(as_document: bool) -> InlineKeyboardMarkup | None:
        return result_buttons(str(job.id), output.index, reroll=seeded(job),
                              edit=can_edit and is_image, as_file=not as_document)

    common: dict[str, Any] = {
        "caption": caption, "parse_mode": ParseMode.HTML,
        "reply_markup": buttons(kind == "document"),
    }
    if reply_to is not None:
        common["reply_parameters"] = _reply(reply_to)
    name = output.filename.rsplit("/", 1)[-1] or "result"
    media = {"has_spoiler": True} if spoiler and kind in SPOILER_KINDS else {}
    if kind == "photo":
        try:
            return await bot.send_photo(chat_id, InputFile(output.data, filename=name), **common,
                                        **media)
        except BadRequest as exc:
            if chat_gone(exc):
                raise
            logger.info("photo refused (%s); sending it as a file", exc.message)
            common["reply_markup"] = buttons(True)
    if kind == "video":
        return await bot.send_video(
            chat_id, InputFile(output.data, filename=name), supports_streaming=True, **common,
            **media,
        )
    if kind == "animation":
        return await bot.send_animation(chat_id, InputFile(output.data, filename=name), **common,
                                        **media)
    return await bot.send_document(
        chat_id, InputFile(output.data, filename=name), disable_content_type_detection=True,
        **common,
    )


async def editors(services: Services) -> list[registry.Entry]:
    """The commands that edit an image as words say, some GPU can run now: what *Edit this*
    suggests (a command that takes an image but no words, such as /invert, edits nothing
    as asked)."""
    entries = availability.runnable(services.pool, await services.commands.all())
    return [e for e in entries if e.takes_image and e.workflow.prompt_param is not None]


CONNECT_WAIT = 15.0  # seconds a result waits for a bot not yet connected, then it is retried


class TelegramUnreachable(sinks.Unreachable):
    """The Bot API did not take the result (down, timing out, answering 5xx or 429, or
    not reached yet since the bot started): tried again once Telegram answers (`back`)."""


class TelegramSink:
    """Sends results to the chat each job came from."""

    def __init__(
        self, bot: Bot, services: Services, connected: asyncio.Event | None = None
    ) -> None:
        self.bot = bot
        self.services = services
        self._connected = connected  # set while the bot is started (None: always)
        self.delivered = 0
        self._inflight: dict[uuid.UUID, asyncio.Future[None]] = {}
        self._done: collections.OrderedDict[uuid.UUID, None] = collections.OrderedDict()
        self._details: dict[uuid.UUID, dict[str, Any]] = {}
        self.migrated: dict[int, int] = {}  # a group's old chat id -> its supergroup's
        # Set from a result Telegram did not take until Telegram answers again (`back`).
        self._down = asyncio.Event()
        self._up = asyncio.Event()

    @property
    def name(self) -> str:
        return SINK_NAME

    def accepts(self, job: jobs.Job) -> bool:
        """Jobs queued without a chat (`comfyveil submit`) are not Telegram's to deliver,
        nor jobs queued on the web (their page shows the result)."""
        return job.chat_id != jobs.NO_CHAT and not accounts.is_web_chat(job.chat_id)

    def reachable(self) -> None:
        """Telegram answers again (the bot started, or a poll went through after failed
        ones): the results it did not take while it was down are tried again now
        (`back`). A send that fails while polls go through waits its delay as before:
        retried at every poll, one Telegram keeps refusing would use its tries up in
        minutes."""
        if self._down.is_set():
            self._down.clear()
            self._up.set()

    async def back(self) -> None:
        """Return when Telegram answers again after the next result it did not take."""
        await self._down.wait()
        await self._up.wait()

    def _unreachable(self, reason: str) -> TelegramUnreachable:
        self._up.clear()
        self._down.set()
        return TelegramUnreachable(reason)

    def delivery_detail(self, job_id: uuid.UUID) -> dict[str, Any] | None:
        """What the worker records with the delivery of `job_id` (the sent message ids),
        once; None when this sink sent nothing for it."""
        return self._details.pop(job_id, None)

    async def deliver(self, job: jobs.Job, outputs: Sequence[jobs.Output]) -> None:
        """Send the result (or the ending); the worker records the delivery.

        Shielded: a delivery that has begun runs to its end (sent, status message finished)
        even when the worker's job task is cancelled meanwhile, so it is never sent twice.
        """
        if job.id in self._done:
            return  # this process already delivered it (a re-delivery after a hiccup)
        if self._connected is not None and not self._connected.is_set():
            # The bot's start is being tried again (Telegram down as the service started):
            # a short wait usually sees it through; past that, as in any outage.
            with contextlib.suppress(TimeoutError):
                await background.wait_for(self._connected.wait(), CONNECT_WAIT)
            if not self._connected.is_set():
                raise self._unreachable(
                    "the Telegram Bot API has not answered since the bot started")
        task = self._inflight.get(job.id)
        if task is None:
            task = asyncio.ensure_future(self._deliver(job, outputs))
            self._inflight[job.id] = task
            task.add_done_callback(lambda t, key=job.id: self._settled(key, t))
        try:
            await asyncio.shield(task)
        except (NetworkError, RetryAfter) as exc:
            # Telegram down, slow or still limiting after the limiter's retries: tried
            # again later, and said in one line, not as an internal error's traceback.
            raise self._unreachable(
                f"Telegram could not be reached ({type(exc).__name__})") from None

    def _settled(self, job_id: uuid.UUID, task: asyncio.Future[None]) -> None:
        self._inflight.pop(job_id, None)
        if not task.cancelled() and task.exception() is None:
            self._done[job_id] = None
            while len(self._done) > DONE_MEMORY:
                self._done.popitem(last=False)

    async def _operator_spoiler(self, job: jobs.Job) -> bool:
        """Whether the workflow or ``[policy]`` hides this job's results behind a spoiler."""
        entry = await self.services.commands.get(job.command)
        return self.services.policy.spoiler(
            job.command, job.chat_id,
            workflow_spoiler=entry is not None and entry.workflow.spoiler,
        )

    async def _deliver(self, job: jobs.Job, outputs: Sequence[jobs.Output]) -> None:
        db = self.services.db
        tracker = self.services.tracker
        # The worker's row was read when the job ended or later; a status message posted
        # after that is the tracker's to finish. How to send was decided when the job was
        # queued here; for a job queued before this process started, read it back (with
        # the user's settings, one query).
        mode = self.services.delivery_modes.pop(job.id, None)
        if mode is None:
            fresh = await db.jobs.for_delivery(job.id)
            if fresh is None:
                return  # the user asked to be forgotten meanwhile
            job, user_settings = fresh
            as_file = job.id in self.services.file_jobs or bool(
                user_settings.get(SEND_AS_FILE_SETTING)
            )
            user_spoiler = bool(user_settings.get(SPOILER_SETTING))
            spoken = language.of_settings(user_settings)
        else:
            as_file = mode[1]
            user_spoiler = job.id in self.services.spoiler_jobs
            spoken = i18n.DEFAULT
        self.services.spoiler_jobs.discard(job.id)
        # This delivery runs in its own task: the language set here is this job's alone.
        i18n.set_language(self.services.job_languages.pop(job.id, None) or spoken)
        operator_spoiler = await self._operator_spoiler(job)
        if operator_spoiler:
            # The operator's spoiler is for everyone in the chat: a file would not be blurred.
            as_file = False
        spoiler = operator_spoiler or user_spoiler
        reply_to, asked_by = self.services.origins.pop(
            job.id, (job.request_message_id, job.requested_by)
        )
        sent: list[int] = []
        chat = _Chat(self, job)
        try:
            if job.status is jobs.Status.SUCCEEDED:
                if not outputs:
                    await chat.send(lambda to: self.bot.send_message(
                        to, _("The job finished but produced no image."),
                    ))
                else:
                    caption = caption_for(job, asked_by=asked_by)
                    can_edit = bool(await editors(self.services))
                    for output in outputs:
                        message = await chat.send(lambda to, output=output: send_output(
                            self.bot, to, job, output, as_file=as_file, caption=caption,
                            reply_to=reply_to, can_edit=can_edit, spoiler=spoiler,
                        ))
                        sent.append(message.message_id)
            elif job.status_message_id is None:
                # No status message to turn into the ending: say it in a message.
                message = await chat.send(lambda to: self.bot.send_message(
                    to, status.final_text(
                        job, detail=job.user_id in self.services.settings.telegram.admins
                    ), parse_mode=ParseMode.HTML, reply_parameters=_reply(reply_to),
                ))
                sent.append(message.message_id)
        except Forbidden as exc:
            raise sinks.Undeliverable(f"Telegram refused the result ({exc.message})") from None
        except BadRequest as exc:
            if chat_gone(exc):
                raise sinks.Undeliverable(
                    f"Telegram refused the result ({exc.message})"
                ) from None
            raise
        self.services.file_jobs.discard(job.id)
        try:
            await tracker.finish(job)
        except TelegramError as exc:  # the status message is a courtesy; the result is sent
            logger.info("status message not finished: %s", type(exc).__name__,
                        extra={"action": "status_unfinished", "job_id": str(job.id)})
        self._details[job.id] = {"message_ids": sent}
        while len(self._details) > DONE_MEMORY:  # a caller that never asks for them
            self._details.pop(next(iter(self._details)))
        self.delivered += 1


class _Chat:
    """Where a job's result goes: its chat, or the supergroup that chat became.

    A group upgraded to a supergroup gets a new id; Telegram answers a send to the old id
    with `migrate_to_chat_id` (PTB's ChatMigrated). The send is made again there, and the
    sink remembers the move so the job's further outputs, and later jobs from that group,
    go straight to the new chat.
    """

    def __init__(self, sink: TelegramSink, job: jobs.Job) -> None:
        self._sink = sink
        self._job = job
        self.chat_id = sink.migrated.get(job.chat_id, job.chat_id)

    async def send(self, send: Callable[[int], Awaitable[Message]]) -> Message:
        try:
            return await send(self.chat_id)
        except ChatMigrated as exc:
            new_id = int(exc.new_chat_id)
            logger.info("the group became a supergroup; sending the result there",
                        extra={"action": "chat_migrated", "job_id": str(self._job.id)})
            self._sink.migrated[self._job.chat_id] = self.chat_id = new_id
            while len(self._sink.migrated) > DONE_MEMORY:
                self._sink.migrated.pop(next(iter(self._sink.migrated)))
            return await send(new_id)
