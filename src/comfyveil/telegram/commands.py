"""The users' commands: /start, /help, the workflow commands, /status, /cancel, /again,
/settings, /history, /forget.

Each handler has the signature ``(update, context, who, text)``: the router in
:mod:`comfyveil.telegram.handlers` has already checked who is writing. They raise
comfyveil's errors (one plain sentence each) and the router's ``plain_errors`` answers.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from telegram import (
    BotCommand,
    BotCommandScopeChat,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Update,
)
from telegram.error import BadRequest

from comfyveil import errors, i18n
from comfyveil.desk import access, availability, language, registry
from comfyveil.desk import state as job_state
from comfyveil.desk import submit as desk_submit
from comfyveil.i18n import N_, _, ltr
from comfyveil.store import jobs
from comfyveil.telegram import callbacks_data, parse, render, replies, submit
from comfyveil.telegram.context import BotContext, Services
from comfyveil.telegram.web_link import web as web_link

logger = logging.getLogger(__name__)

Handler = Callable[[Update, BotContext, access.Who, str], Awaitable[None]]

# Translated where the menu is published, once per language.
BUILTIN_MENU: tuple[tuple[str, str], ...] = (
    ("help", N_("What I can do")),
    ("status", N_("Your jobs waiting or running")),
    ("cancel", N_("Stop your job (or /cancel #id)")),
    ("again", N_("Your last job again, new seed")),
    ("settings", N_("Size, steps, seed, file, spoiler, language")),
    ("history", N_("Your last jobs")),
    ("forget", N_("Delete all your data")),
)
WEB_MENU = ("web", N_("A link to use me in a browser"))  # when [web] is enabled
# The admin commands (telegram/admin.py), in each admin's own menu only.
ADMIN_MENU: tuple[tuple[str, str], ...] = (
    ("users", N_("Users, roles and today's jobs")),
    ("allow", N_("Let a user in: /allow ID")),
    ("ban", N_("Refuse a user: /ban ID")),
    ("quota", N_("A user's daily quota: /quota ID N")),
    ("backends", N_("The GPUs: up or down, busy, what they lack")),
    ("workflows", N_("The commands and what each needs")),
    ("policy", N_("Prompts refused by the content policy")),
)
# What users read, in one place (to be translated as a whole).
START_HELLO = N_("Hi! I turn your words into images on our own GPUs.")
START_TRY = N_("Try {example}.")
START_EDIT_ONLY = N_("Send a photo with the caption {example}.")
START_NOTHING = N_("No GPU can run any of my commands right now; try again later.")
START_HELP = N_("{help} lists every command and its options.")
ASPECTS = ("1:1", "16:9", "9:16", "4:3", "3:4")
STEP_CHOICES = ("4", "8", "20", "30")
HISTORY_LIMIT = 10
SPOILER_KEY = "spoiler"  # the /settings key; sink.SPOILER_SETTING reads it
LANGUAGES_PER_ROW = 4
FIND_LIMIT = 50  # recent jobs searched for a /cancel #id


def _in_group(update: Update) -> bool:
    chat = update.effective_chat
    return chat is not None and chat.type != "private"


def _seen_here(update: Update) -> int | None:
    """The chat whose jobs a user's job commands may show (None: all of theirs). In a group
    only the jobs asked for there: the rest (prompts, seeds, results) were private."""
    chat = update.effective_chat
    return chat.id if chat is not None and chat.type != "private" else None


ONLY_THIS_CHAT = N_("Only your jobs from this chat are shown here; send {command} to me in a "
                    "private chat for all of them.")


def _with_group_note(update: Update, text: str, command: str) -> str:
    if _seen_here(update) is None:
        return text
    return text + "\n" + _(ONLY_THIS_CHAT).format(command=ltr(command))


async def runnable_entries(services: Services) -> list[registry.Entry]:
    """The enabled commands some GPU can run now."""
    return availability.runnable(services.pool, await services.commands.all())


async def publish_menu(services: Services, bot: Any) -> tuple[str, ...]:
    """Register the commands some GPU can run now and the built-in ones with Telegram's
    command menu, once per shipped language (``setMyCommands`` with ``language_code``);
    the workflow commands published (everyone's).

    Everyone's menu (the default scope) lists the commands users may run; each admin's
    private chat gets its own scope with the admins-only commands too, so a command an
    operator kept for admins is never offered to the others. Telegram prefers a chat's
    own menu to any language's, so an admin's is in that admin's language.
    """
    entries = await runnable_entries(services)

    def menu(admin: bool, code: str) -> list[BotCommand]:
        shown = [e for e in entries if admin or not e.admins_only]
        with i18n.using(code):
            listed = [BotCommand(e.name, (e.title() or e.name)[:256]) for e in shown]
            listed += [BotCommand(name, _(text)) for name, text in BUILTIN_MENU]
            if services.settings.web.enabled:
                listed.append(BotCommand(WEB_MENU[0], _(WEB_MENU[1])))
            if admin:
                listed += [BotCommand(name, _(text)) for name, text in ADMIN_MENU]
        return listed[:100]

    for code in i18n.LANGUAGES:
        # Users whose app language we have no catalog for get the default (English) menu.
        await bot.set_my_commands(
            menu(admin=False, code=code), language_code=None if code == i18n.DEFAULT else code
        )
    admins = {*services.settings.telegram.admins, *await services.db.users.admin_ids()}
    for admin_id in sorted(admins):
        spoken = language.of_settings(await services.db.users.settings(admin_id))
        try:
            await bot.set_my_commands(menu(admin=True, code=spoken),
                                      scope=BotCommandScopeChat(admin_id))
        except BadRequest as exc:  # an admin who never opened a chat with the bot
            logger.info("no admin menu for one admin: %s", exc.message,
                        extra={"action": "admin_menu_skipped"})
    return tuple(e.name for e in entries)


# --- basics -----------------------------------------------------------------------------


async def start(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """Greet and point at /help."""
    services = context.services
    entries = availability.runnable(services.pool, await services.commands.for_user(who))
    example = next((e.name for e in entries if not e.takes_image), None)
    lines = [_(START_HELLO)]
    if example is not None:
        shown = f"/{replies.esc(example)} " + replies.esc(_("a red fox in the snow"))
        lines.append(_(START_TRY).format(example=ltr(f"<code>{shown}</code>")))
    elif entries:
        shown = f"/{replies.esc(entries[0].name)} " + replies.esc(_("make it night"))
        lines.append(_(START_EDIT_ONLY).format(example=ltr(f"<code>{shown}</code>")))
    else:
        lines.append(_(START_NOTHING))
    lines.append(_(START_HELP).format(help=ltr("/help")))
    await replies.reply(update, "\n".join(lines))


async def help_(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """The enabled commands this user may run, with their options; those no GPU can run
    now marked so."""
    services = context.services
    entries = await services.commands.for_user(who)
    runnable = availability.runnable(services.pool, entries)
    others = [e for e in entries if e not in runnable]
    await replies.reply(update, render.help_text(
        [e.help() for e in runnable], [e.help() for e in others],
        unavailable_mark=availability.UNAVAILABLE_MARK, web=services.settings.web.enabled,
    ))


# --- workflow commands ------------------------------------------------------------------


async def run_workflow(
    update: Update, context: BotContext, who: access.Who, entry: registry.Entry, text: str
) -> None:
    """/f, /qwen, ...: parse, check, find the image, queue, show the status."""
    services = context.services
    message = update.effective_message
    assert message is not None
    wf = entry.workflow
    await availability.confirm(services.pool, entry)
    prompt_param = wf.prompt_param
    # The limit users are told is the one that binds: the workflow's own when it is lower.
    max_chars = services.settings.limits.max_prompt_length
    own = wf.params[prompt_param].max_length if prompt_param is not None else None
    if own is not None:
        max_chars = min(max_chars, own)
    parsed = parse.parse(
        text, entry.options, bot_username=services.bot_username, in_group=_in_group(update),
        require_prompt=prompt_param is not None and wf.params[prompt_param].required,
        takes_prompt=prompt_param is not None,
        negative_allowed=entry.negative_allowed,
        max_prompt_chars=max_chars,
    )
    if parsed is None:
        return
    await desk_submit.check_allowed(services, who, entry)
    prefs = who.settings
    values, as_file = submit.build_values(entry, parsed, prefs)
    await desk_submit.check_policy(services, entry.name, desk_submit.policy_texts(wf, values))
    validated = desk_submit.validate(services.settings, wf, values)
    inputs = []
    if entry.takes_image:
        inputs.append(await submit.find_image(context.bot, services, message, entry))
    await submit.submit(
        services, context.bot, who=who, in_group=_in_group(update), entry=entry,
        values=validated, inputs=inputs,
        key=submit.idempotency_key(who.chat_id, update.update_id),
        reply_to=message.message_id, as_file=as_file,
        asked_by=submit.asker(update.effective_user, in_group=_in_group(update)),
    )


# --- the user's jobs --------------------------------------------------------------------


async def status(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """My jobs waiting or running, with positions."""
    services = context.services
    active = await services.db.jobs.list_for_user(
        who.user_id, limit=20, statuses=[jobs.Status.QUEUED, jobs.Status.RUNNING],
        chat_id=_seen_here(update),
    )
    if not active:
        await replies.reply(update, _with_group_note(
            update, _("You have no jobs waiting or running."), "/status"))
        return
    lines = [_("<b>Your jobs</b>")]
    for job in reversed(active):
        state = await services.tracker.text_for(job)
        named = f"<code>#{render.short_id(str(job.id))}</code> /{replies.esc(job.command)}"
        lines.append(f"{ltr(named)}{render.DOT}{state}")
    lines.append(_("{cancel} stops the newest; {cancel_id} a given one.").format(
        cancel=ltr("/cancel"), cancel_id=ltr("/cancel #id")))
    await replies.reply(update, _with_group_note(update, "\n".join(lines), "/status"))


async def _find_job(services: Services, who: access.Who, ref: str | None,
                    chat_id: int | None = None) -> jobs.Job:
    if ref is None:
        active = await services.db.jobs.list_for_user(
            who.user_id, limit=1, statuses=[jobs.Status.QUEUED, jobs.Status.RUNNING],
            chat_id=chat_id,
        )
        if not active:
            raise errors.UsageError(_("You have no job waiting or running."))
        return active[0]
    wanted = ref.replace("-", "")
    for job in await services.db.jobs.list_for_user(who.user_id, limit=FIND_LIMIT):
        if job.id.hex.startswith(wanted):
            return job
    raise errors.UsageError(_(NO_SUCH_JOB).format(id=ltr(f"#{ref[:12]}"),
                                                  status=ltr("/status")))


async def cancel(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """Cancel my newest job waiting or running, or the one named (#id)."""
    services = context.services
    parsed = parse.parse(text, {}, bot_username=services.bot_username,
                         in_group=_in_group(update))
    named = (parsed.prompt or "").split() if parsed else []
    if parsed is not None and parsed.target_job is None and named:
        # "/cancel #zzzz" or "/cancel 12": an id that can't be one, not "no job at all"
        raise errors.UsageError(_(NOT_AN_ID).format(
            ref=ltr(named[0][:20]), status=ltr("/status"), example=ltr("/cancel #3f2a9c1d")))
    job = await _find_job(services, who, parsed.target_job if parsed else None,
                          chat_id=_seen_here(update))
    await replies.reply(update, await cancel_job(services, who, job))


ENDING_CLAIMER = "chat-cancel"  # who holds a delivery claim while /cancel says the ending
ENDING_CLAIM_SECONDS = 120.0  # longer than the sentence's retries through Bot API failures

NOT_AN_ID = N_("{ref} is not a job id: write # and the id {status} shows, such as {example}.")
NO_SUCH_JOB = N_("None of your jobs has the id {id}; {status} lists yours.")
CANCEL_ENDED = N_("Job {id} has already ended.")
CANCEL_DONE = N_("Cancelled job {id}.")
CANCEL_STOPPING = N_("Stopping job {id} on its GPU…")


async def cancel_job(services: Services, who: access.Who, job: jobs.Job) -> str:
    """Cancel `job` of `who` (the /cancel command and the status message's button); the
    answer (Telegram HTML).

    Raises:
        UsageError: the job is gone.
    """
    short = ltr(f"<code>#{render.short_id(str(job.id))}</code>")
    if job.status.finished:
        return _(CANCEL_ENDED).format(id=short)
    result = await services.db.jobs.cancel(job.id, by_user=who.user_id)
    if result is None:
        raise errors.UsageError(_("That job is no longer there."))
    if result.status is jobs.Status.CANCELLED:
        # Never claimed by a worker, so no worker will deliver it: end it here. With no
        # status message to turn into "Cancelled." (its post failed or was put off), the
        # request gets the sentence in a reply: an answer to /cancel alone names a job id
        # its user never saw. The delivery is claimed first: the worker in this process
        # hears the job ended and its sink would say it too (it answers an ending with no
        # status message so); when it holds the claim, it says it.
        if services.tracker.status_message(result) is None:
            if not await services.db.jobs.claim_delivery(
                result.id, "telegram", ENDING_CLAIMER, seconds=ENDING_CLAIM_SECONDS
            ):
                return _(CANCEL_DONE).format(id=short)
            reply_to = result.request_message_id or services.origins.get(result.id, (None,))[0]
            await services.tracker.say_ending(result, reply_to)
        await services.tracker.finish(result)
        await services.db.jobs.record_delivery(result.id, "telegram", {"cancelled_by": "user"})
        return _(CANCEL_DONE).format(id=short)
    if result.status is jobs.Status.RUNNING:
        return _(CANCEL_STOPPING).format(id=short)
    return _(CANCEL_ENDED).format(id=short)


async def again(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """My last job again, with a new seed."""
    services = context.services
    last = await services.db.jobs.list_for_user(who.user_id, limit=1,
                                                chat_id=_seen_here(update))
    if not last:
        raise errors.UsageError(_("You have no job to repeat yet."))
    message = update.effective_message
    await submit.rerun(
        services, context.bot, who=who, in_group=_in_group(update), job=last[0],
        key=submit.idempotency_key(who.chat_id, update.update_id),
        reply_to=message.message_id if message else None,
        asked_by=submit.asker(update.effective_user, in_group=_in_group(update)),
    )


async def history(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """My last jobs."""
    services = context.services
    recent = await services.db.jobs.list_for_user(who.user_id, limit=HISTORY_LIMIT,
                                                  chat_id=_seen_here(update))
    entries = []
    for job in recent:
        prompt = job.params.get("prompt")
        # The state in the words every front end uses; a result's time is its run on
        # the GPU, from ComfyUI's start (desk/state.py).
        seen = job_state.of(job)
        elapsed = seen.running_s if job.status is jobs.Status.SUCCEEDED else None
        seed = job.params.get("seed")
        entries.append(render.HistoryEntry(
            id=str(job.id), command=job.command,
            prompt=prompt if isinstance(prompt, str) else "", status=job_state.key(seen.stage),
            created_at=job.created_at, seed=seed if isinstance(seed, int) else None,
            elapsed_s=elapsed,
        ))
    await replies.reply(update, _with_group_note(update, render.history_text(entries),
                                                 "/history"))


# --- settings ---------------------------------------------------------------------------


def settings_text(prefs: Mapping[str, Any]) -> str:
    seed = _("random")
    if prefs.get("seed_mode") == "fixed":
        seed = _("fixed ({seed})").format(seed=ltr(prefs.get("seed")))
    default = _("workflow default")

    def on(flag: object) -> str:
        return _("on") if flag else _("off")

    lines = [
        _("<b>Your settings</b> (options in a command win over these)"),
        _("Aspect ratio: {value}").format(
            value=replies.esc(ltr(prefs["ar"]) if prefs.get("ar") else default)),
        _("Steps: {value}").format(
            value=replies.esc(ltr(prefs["steps"]) if prefs.get("steps") else default)),
        _("Seed: {value}").format(value=replies.esc(seed)),
        _("Send results as files: {value}").format(value=on(prefs.get("as_file"))),
        _("Results behind a spoiler: {value}").format(value=on(prefs.get(SPOILER_KEY))),
        _("Language: {value}").format(value=_language_name(prefs)),
    ]
    return "\n".join(lines)


def _language_name(prefs: Mapping[str, Any]) -> str:
    choice = prefs.get(language.CHOICE)
    if isinstance(choice, str) and choice in i18n.NATIVE_NAMES:
        return i18n.NATIVE_NAMES[choice]
    return _("auto ({language})").format(
        # what the user reads now: their Telegram app's language, or English
        language=i18n.NATIVE_NAMES[i18n.current()])


def _language_rows(
    prefs: Mapping[str, Any], button: Callable[[str, str, str, bool], InlineKeyboardButton]
) -> list[list[InlineKeyboardButton]]:
    """auto (the Telegram app's language), then each shipped language in its own name."""
    choice = prefs.get(language.CHOICE) or ""
    buttons = [button(_("auto language"), language.CHOICE, "", not choice)] + [
        button(name, language.CHOICE, code, choice == code)
        for code, name in i18n.NATIVE_NAMES.items()
    ]
    return [buttons[i : i + LANGUAGES_PER_ROW] for i in range(0, len(buttons),
                                                              LANGUAGES_PER_ROW)]


def settings_keyboard(
    prefs: Mapping[str, Any], owner: int | None = None
) -> InlineKeyboardMarkup:
    """The /settings buttons; `owner`: the user whose settings they change (only their
    presses count)."""

    def button(label: str, key: str, value: str, current: bool) -> InlineKeyboardButton:
        return InlineKeyboardButton(("✓ " if current else "") + label,
                                    callback_data=callbacks_data.setting(key, value, owner))

    ar = str(prefs.get("ar") or "")
    steps = str(prefs.get("steps") or "")
    fixed = prefs.get("seed_mode") == "fixed"
    as_file = bool(prefs.get("as_file"))
    spoiler = bool(prefs.get(SPOILER_KEY))
    return InlineKeyboardMarkup([
        [button(_("auto size"), "ar", "", not ar)]
        + [button(a, "ar", a, ar == a) for a in ASPECTS],
        [button(_("auto steps"), "steps", "", not steps)]
        + [button(s, "steps", s, steps == s) for s in STEP_CHOICES],
        [button(_("random seed"), "seed", "random", not fixed),
         button(_("fixed seed"), "seed", "fixed", fixed)],
        [button(_("photos"), "file", "off", not as_file),
         button(_("files"), "file", "on", as_file)],
        [button(_("no spoiler"), SPOILER_KEY, "off", not spoiler),
         button(_("spoiler"), SPOILER_KEY, "on", spoiler)],
        *_language_rows(prefs, button),
    ])


def settings_change(key: str, value: str, prefs: Mapping[str, Any]) -> tuple[dict[str, Any],
                                                                             list[str]]:
    """The (changes, removals) a settings button stands for.

    Raises:
        UsageError: a value the keyboard never offers.
    """
    if key == "ar" and (value == "" or value in ASPECTS):
        return ({"ar": value}, []) if value else ({}, ["ar"])
    if key == "steps" and (value == "" or value in STEP_CHOICES):
        return ({"steps": int(value)}, []) if value else ({}, ["steps"])
    if key == "seed" and value in ("random", "fixed"):
        if value == "random":
            return {"seed_mode": "random"}, ["seed"]
        seed = prefs.get("seed") if isinstance(prefs.get("seed"), int) else random.randint(
            0, 2**32 - 1)
        return {"seed_mode": "fixed", "seed": seed}, []
    if key == "file" and value in ("on", "off"):
        return {"as_file": value == "on"}, []
    if key == SPOILER_KEY and value in ("on", "off"):
        return {SPOILER_KEY: value == "on"}, []
    if key == language.CHOICE and (value == "" or value in i18n.LANGUAGES):
        return ({language.CHOICE: value}, []) if value else ({}, [language.CHOICE])
    raise errors.UsageError(_("That setting is not offered."))


async def settings(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """Show my settings with buttons to change them."""
    prefs = who.settings
    await replies.reply(update, settings_text(prefs),
                        reply_markup=settings_keyboard(prefs, who.user_id))


# --- forgetting -------------------------------------------------------------------------


async def forget(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """Ask to confirm deleting everything stored about me."""
    keyboard = InlineKeyboardMarkup([[
        InlineKeyboardButton(_("Delete everything"),
                             callback_data=callbacks_data.forget(True, who.user_id)),
        InlineKeyboardButton(_("Keep it"),
                             callback_data=callbacks_data.forget(False, who.user_id)),
    ]])
    await replies.reply(
        update,
        _("This deletes all your jobs, results, input images, settings and your place in "
          "the queue, and stops a job running now on its GPU. What the limits count (jobs "
          "today, the time of the last) stays, with no prompt or image. Are you sure?"),
        reply_markup=keyboard,
    )


COMMANDS: dict[str, Handler] = {
    "start": start,
    "help": help_,
    "status": status,
    "cancel": cancel,
    "again": again,
    "settings": settings,
    "history": history,
    "forget": forget,
    "web": web_link,  # a one-time link to the web front end
}
