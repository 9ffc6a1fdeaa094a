"""From a parsed command to a queued job with its status message.

Shared by the workflow commands, /again and the re-roll button: build the workflow's
values (the user's options over their /settings over the workflow's defaults), find the
input image of edit workflows, queue the job (the update id is the idempotency key, so a
retried update never makes a second job) and post the status message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from telegram import Bot, Message, User
from telegram.error import BadRequest, TelegramError

from comfyveil import errors, i18n, images
from comfyveil.desk import access, registry
from comfyveil.desk import submit as desk_submit
from comfyveil.desk.options import clamp, size_for
from comfyveil.desk.submit import IMAGE_PLACEHOLDER
from comfyveil.i18n import _, ltr
from comfyveil.store import errors as store_errors
from comfyveil.store import jobs
from comfyveil.telegram import parse
from comfyveil.telegram.context import DELIVERY_MODES_KEPT, Services
from comfyveil.telegram.sink import SEND_AS_FILE_SETTING, SPOILER_SETTING

logger = logging.getLogger(__name__)

TELEGRAM_DOWNLOAD_LIMIT = 20 * 1024 * 1024  # getFile refuses larger files (cloud Bot API)


def idempotency_key(chat_id: int, update_id: int) -> str:
    return f"tg:{chat_id}:{update_id}"


ASKER_CHARS = 64  # a display name in a caption, at most
STATUS_POST_RETRY = 2.0  # seconds before a status message the Bot API failed is tried again


def asker(user: User | None, *, in_group: bool) -> str | None:
    """Who asked, as a group's caption names them (None in private chats: it's you)."""
    if user is None or not in_group:
        return None
    name = " ".join(p for p in (user.first_name, user.last_name) if p).strip()
    if not name and user.username:
        name = "@" + user.username
    return name[:ASKER_CHARS] or None


def build_values(
    entry: registry.Entry, parsed: parse.ParsedCommand, prefs: Mapping[str, Any]
) -> tuple[dict[str, object], bool | None]:
    """The workflow values for a command, and whether it asked for a file (None: not said).

    Raises:
        ParseError, ParamError: an option the workflow does not have.
    """
    wf = entry.workflow
    options: dict[str, str] = {}
    as_file: bool | None = None
    aspect: str | None = None
    for key, value in parsed.options.items():
        if key == parse.FILE_OPTION:
            as_file = value == "yes"
        elif key == parse.ASPECT_OPTION:
            aspect = value
        else:
            options[wf.param(key).name] = value
    has_size = "width" in wf.params and "height" in wf.params
    if aspect is not None and not has_size:
        raise parse.ParseError(
            _("{command} has no width and height, so {ar} cannot be used.").format(
                command=ltr(f"/{entry.name}"), ar=ltr("--ar")))
    values: dict[str, object] = {}
    aspect = aspect or (str(prefs["ar"]) if has_size and prefs.get("ar") else None)
    if aspect and not {"width", "height"} & set(options):
        values["width"], values["height"] = size_for(wf, aspect)
    steps = wf.params.get("steps")
    if steps is not None and "steps" not in options and isinstance(prefs.get("steps"), int):
        values["steps"] = clamp(int(prefs["steps"]), steps)
    if (
        "seed" in wf.params and "seed" not in options
        and prefs.get("seed_mode") == "fixed" and isinstance(prefs.get("seed"), int)
    ):
        values["seed"] = prefs["seed"]
    values.update(options)
    prompt_param = wf.prompt_param
    if prompt_param is not None:
        values[prompt_param] = parsed.prompt
    if parsed.negative is not None:
        values["negative"] = parsed.negative
    for name in wf.image_params:
        values[name] = IMAGE_PLACEHOLDER
    return values, as_file


# --- input images -----------------------------------------------------------------------


def _media_of(message: Message | None) -> tuple[str, int | None] | None:
    """(file_id, size) of the photo (largest size) or document a message carries."""
    if message is None:
        return None
    if message.photo:
        largest = message.photo[-1]
        return largest.file_id, largest.file_size
    if message.document is not None:
        return message.document.file_id, message.document.file_size
    return None


async def download_checked(
    bot: Bot, services: Services, file_id: str, size: int | None
) -> jobs.InputImage:
    """Fetch a file from Telegram and check it is an image within our limits.

    Raises:
        ImageRejected: not an image, damaged, or too large.
    """
    limits = services.settings.limits
    if size is not None and size > min(limits.max_image_bytes, TELEGRAM_DOWNLOAD_LIMIT):
        limit = min(limits.max_image_bytes, TELEGRAM_DOWNLOAD_LIMIT) // (1024 * 1024)
        raise images.ImageRejected(_("That file is {size}; the limit is {limit}.").format(
            size=ltr(_("{n} MB").format(n=f"{size / (1024 * 1024):.1f}")),
            limit=ltr(_("{n} MB").format(n=limit))))
    try:
        tg_file = await bot.get_file(file_id)
        data = bytes(await tg_file.download_as_bytearray())
    except BadRequest as exc:
        if "too big" in exc.message:
            raise images.ImageRejected(
                _("That file is too large for a bot to download (20 MB at most).")
            ) from exc
        raise images.ImageRejected(
            _("That file could not be downloaded; send it again.")) from exc
    checked = await asyncio.to_thread(
        images.check_image, data, max_bytes=limits.max_image_bytes,
        max_pixels=limits.max_image_pixels,
    )
    ext = {"image/jpeg": "jpg", "image/png": "png", "image/webp": "webp"}[checked.mime]
    return jobs.InputImage(filename=f"telegram.{ext}", mime=checked.mime, data=checked.data)


async def find_image(
    bot: Bot, services: Services, message: Message, entry: registry.Entry
) -> jobs.InputImage:
    """The image an edit command works on: a photo sent with the command, else the photo
    it replies to, else the chat's last result (chaining).

    Raises:
        ImageRejected: the photo is not a usable image.
        UsageError: there is no image at all.
    """
    media = _media_of(message) or _media_of(message.reply_to_message)
    if media is not None:
        return await download_checked(bot, services, *media)
    db = services.db
    session = await db.sessions.last_outputs(message.chat.id)
    if session is not None:
        wanted = [o for o in session.outputs if o.mime.startswith("image/")]
        if wanted:
            outputs = {o.index: o for o in await db.jobs.outputs(session.job_id)}
            stored = outputs.get(wanted[0].index)
            if stored is not None:
                return jobs.InputImage(
                    filename=stored.filename.rsplit("/", 1)[-1], mime=stored.mime,
                    data=stored.data,
                )
    raise errors.UsageError(
        _("{command} edits an image: send it as the caption of a photo, reply to a "
          "photo with it, or make an image first.").format(command=ltr(f"/{entry.name}"))
    )


# --- queueing ---------------------------------------------------------------------------


async def submit(
    services: Services,
    bot: Bot,
    *,
    who: access.Who,
    in_group: bool,
    entry: registry.Entry,
    values: Mapping[str, object],
    inputs: Sequence[jobs.InputImage],
    key: str,
    reply_to: int | None,
    as_file: bool | None = None,
    asked_by: str | None = None,
) -> jobs.Job:
    """Queue the job and post its status message; the job (an existing one for a retry).

    `reply_to` is the message that asked for it (its status and result answer it),
    `asked_by` who asked, named in the result's caption in groups.

    Raises:
        QueueLimitReached, DailyQuotaReached, CoolingDown: the user must wait.
    """
    new_id = uuid.uuid4()
    # the desk's one way into the queue: the access rule and the content policy again,
    # whatever was checked before, so no way into the queue skips them
    job = await desk_submit.queue(services, who, entry, values, inputs, key=key, job_id=new_id)
    if job.id != new_id:
        logger.info("update seen before; job already queued",
                    extra={"action": "duplicate_update", "job_id": str(job.id)})
        return job
    if reply_to is not None:
        # On record now, not only with the status message (which the Bot API may fail to
        # take): a result or ending delivered after this process is gone still answers
        # the message that asked for it. Not recorded, this process still knows it.
        with contextlib.suppress(store_errors.StoreError):
            await services.db.jobs.set_request(job.id, reply_to, requested_by=asked_by)
    if as_file:
        services.file_jobs.add(job.id)
    if who.settings.get(SPOILER_SETTING):
        services.spoiler_jobs.add(job.id)
    services.job_languages[job.id] = i18n.current()
    while len(services.job_languages) > DELIVERY_MODES_KEPT:  # never delivered: forget
        services.job_languages.pop(next(iter(services.job_languages)))
    setting = bool(who.settings.get(SEND_AS_FILE_SETTING))
    services.remember_delivery(
        job.id, who.user_id, as_file=as_file if as_file is not None else setting,
        reply_to=reply_to, asked_by=asked_by,
    )
    delay = services.settings.telegram.status_delay
    if delay > 0:
        services.tracker.post_later(job, delay=delay, reply_to=reply_to, in_group=in_group,
                                    asked_by=asked_by)
        return job
    try:
        return await services.tracker.post(job, reply_to=reply_to, in_group=in_group,
                                           asked_by=asked_by)
    except TelegramError as exc:
        # The job is queued: telling its user "something went wrong, try again" would have
        # them queue it twice. The status message is tried once more; the result or the
        # ending comes when the job ends either way.
        logger.info("status message not posted: %s", type(exc).__name__,
                    extra={"action": "status_post_failed", "job_id": str(job.id)})
        services.tracker.post_later(job, delay=STATUS_POST_RETRY, reply_to=reply_to,
                                    in_group=in_group, asked_by=asked_by)
        return job


async def rerun(
    services: Services,
    bot: Bot,
    *,
    who: access.Who,
    in_group: bool,
    job: jobs.Job,
    key: str,
    reply_to: int | None,
    asked_by: str | None = None,
) -> jobs.Job:
    """Queue `job` again with a new seed (/again and the re-roll button).

    Raises:
        UsageError: the command is off now, or the input image is no longer kept.
    """
    entry, validated, inputs = await desk_submit.again(services, services.commands, who, job)
    return await submit(
        services, bot, who=who, in_group=in_group, entry=entry, values=validated,
        inputs=inputs, key=key, reply_to=reply_to,
        as_file=job.id in services.file_jobs or None, asked_by=asked_by,
    )
