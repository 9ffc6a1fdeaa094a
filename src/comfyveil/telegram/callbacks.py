"""Inline button presses: re-roll, edit this, send as file, /settings, /forget.

Every press is answered (``answerCallbackQuery``), with a short text or a plain-sentence
refusal, so the button never keeps spinning.
"""

from __future__ import annotations

import logging
import re

from telegram import InputFile, ReplyParameters, Update
from telegram.constants import ParseMode
from telegram.error import BadRequest

from comfyveil import errors, i18n
from comfyveil.desk import access, language
from comfyveil.desk import jobs as desk_jobs
from comfyveil.i18n import N_, _, ltr
from comfyveil.store import sessions
from comfyveil.telegram import callbacks_data, commands, replies, sink, submit
from comfyveil.telegram.context import BotContext

logger = logging.getLogger(__name__)

# What users read, in one place; every answer is translated as it is sent (on_callback).
NOT_YOURS_JOB = N_("Only the one who asked for this job can cancel it.")
NOT_YOURS_MESSAGE = N_("These buttons are for the one who sent the command; send it yourself.")
NO_EDITOR = N_("No command that edits images can run right now.")
NO_EDITOR_FOR_YOU = N_("No command that edits images is open to you on this bot.")
NOT_YOURS_RESULT = N_("Only the one who asked for this result can re-roll or edit it.")


async def on_callback(update: Update, context: BotContext) -> None:
    """Route a button press; answer it in every case."""
    query = update.callback_query
    if query is None:
        return
    i18n.set_language(query.from_user.language_code)  # until we know the user's choice
    press = callbacks_data.parse(query.data)
    answer: str | None = None
    alert = False
    try:
        if press is None or query.message is None:
            answer = N_("That button no longer works.")
        else:
            who = await context.services.access.require(
                query.from_user.id, query.message.chat.id
            )
            await language.note(context.services.db.users, query.from_user.id, who.settings,
                                query.from_user.language_code)
            answer, alert = await _dispatch(update, context, who, press)
    except errors.ComfyveilError as exc:
        answer, alert = replies.user_message(exc), True
    try:
        # Answers are English message ids (or already translated): said in the user's
        # language here.
        await query.answer(_(answer) if answer else answer, show_alert=alert)
    except BadRequest as exc:
        logger.info("press not answered: %s", exc.message)


async def _dispatch(
    update: Update, context: BotContext, who: access.Who, press: callbacks_data.Press
) -> tuple[str | None, bool]:
    services = context.services
    query = update.callback_query
    assert query is not None and query.message is not None
    chat = query.message.chat
    if press.owner is not None and press.owner != who.user_id:
        return NOT_YOURS_MESSAGE, True
    if press.action == "set":
        prefs = who.settings
        changes, remove = commands.settings_change(press.key, press.value, prefs)
        prefs = await services.db.users.update_settings(who.user_id, changes, remove)
        i18n.set_language(language.of_settings(prefs))  # a new language answers at once
        try:
            await query.edit_message_text(
                commands.settings_text(prefs), parse_mode=ParseMode.HTML,
                reply_markup=commands.settings_keyboard(prefs, who.user_id),
            )
        except BadRequest as exc:
            if "not modified" not in exc.message:
                raise
        return N_("Saved."), False
    if press.action == "forget":
        if press.value != "yes":
            await query.edit_message_text(_("Nothing was deleted."))
            return None, False
        services.forget_deliveries_of(who.user_id)
        deleted = await desk_jobs.forget(services.db, services.pool, who.user_id,
                                         services.spawn)
        await query.edit_message_text(i18n.ngettext(
            "Done: {n} job, its images and your settings were deleted.",
            "Done: {n} jobs, their images and your settings were deleted.", deleted,
        ).format(n=ltr(deleted)))
        return N_("Deleted."), False

    assert press.job_id is not None
    job = await services.db.jobs.get(press.job_id)
    if job is None:
        return N_("That result is no longer stored."), True
    if press.action == "cancel":
        if job.user_id != who.user_id:
            return NOT_YOURS_JOB, True
        answer = await commands.cancel_job(services, who, job)
        return re.sub(r"<[^>]+>", "", answer), False
    if press.action in ("again", "edit") and job.user_id != who.user_id:
        return NOT_YOURS_RESULT, True
    if job.user_id != who.user_id and job.chat_id != chat.id and not who.is_admin:
        return N_("That is not your result."), True
    if press.action == "again":
        await submit.rerun(
            services, context.bot, who=who, in_group=chat.type != "private", job=job,
            key=submit.idempotency_key(chat.id, update.update_id),
            reply_to=query.message.message_id,
            asked_by=submit.asker(query.from_user, in_group=chat.type != "private"),
        )
        return N_("Re-rolling with a new seed…"), False
    outputs = await services.db.jobs.outputs(job.id)
    output = next((o for o in outputs if o.index == press.index), None)
    if output is None:
        return N_("That result is no longer stored."), True
    if press.action == "edit":
        allowed = {e.name for e in await services.commands.for_user(who)}
        runnable = await sink.editors(services)
        entries = [e for e in runnable if e.name in allowed]
        if not entries:
            return (NO_EDITOR_FOR_YOU if runnable else NO_EDITOR), True
        await services.db.sessions.set_last_outputs(
            chat.id, job.user_id, job.id,
            [sessions.OutputRef(output.index, output.filename, output.kind, output.mime)],
        )
        name = entries[0].name
        return _(
            "Send {command} and what to change, e.g. {example}. It will edit this image "
            "(replying to it with the command works too)."
        ).format(command=ltr(f"/{name}"), example=ltr(f"/{name} " + _("make it night"))), True
    if press.action == "file":
        await context.bot.send_document(
            chat.id, InputFile(output.data, filename=output.filename.rsplit("/", 1)[-1]),
            disable_content_type_detection=True,
            reply_parameters=ReplyParameters(query.message.message_id,
                                             allow_sending_without_reply=True),
        )
        return N_("Full quality, as a file."), False
    return N_("That button no longer works."), False
