"""Admin commands: /users, /allow ID, /ban ID, /quota ID N, /backends, /workflows, /policy.

Admins are the ids in ``[telegram] admins`` and users with the ``admin`` role.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from telegram import Update

from comfyveil import errors, i18n
from comfyveil.comfy import health
from comfyveil.desk import access, availability
from comfyveil.desk.words import ROLE_WORDS, SOURCE_WORDS
from comfyveil.i18n import N_, _, ltr
from comfyveil.models import local as model_files
from comfyveil.store import accounts, jobs
from comfyveil.telegram import commands, policy_view, replies
from comfyveil.telegram.context import BotContext

USERS_SHOWN = 40

def _args(text: str) -> list[str]:
    return text.split()[1:]


CHAT_NOT_USER = N_("{id} is a group's id, not a user's: {command} takes one user's id, and a "
                   "whole group is let in by adding its id to [telegram] allow in the "
                   "configuration.")


def _user_id(word: str, command: str) -> int:
    try:
        user_id = int(word)
    except ValueError:
        raise errors.UsageError(_("{value} is not a Telegram user id (a number).").format(
            value=ltr(repr(word[:20])))) from None
    # Telegram's users have positive ids, its groups and channels negative ones; web
    # accounts sit far below both. Granting a group's id would change nothing for its
    # members, so it is refused rather than answered as done.
    if accounts.WEB_ID_BASE < user_id < 0:
        raise errors.UsageError(_(CHAT_NOT_USER).format(
            id=ltr(user_id), command=ltr(command)))
    return user_id


async def users(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """Known users with role, quota and today's jobs."""
    tg = context.services.settings.telegram
    rows = await context.services.db.users.overview(limit=USERS_SHOWN)
    default_quota = context.services.settings.limits.daily_quota
    mode = _("open to everyone") if tg.open else _("allow-list")
    admins = i18n.join_list(ltr(a) for a in tg.admins) or _("none")
    lines = [_("<b>Users</b>"),
             _("Mode: {mode}; admins from config: {admins}").format(mode=mode, admins=admins)]
    if tg.allow:
        lines.append(_("Allowed in config: {ids}").format(
            ids=i18n.join_list(ltr(a) for a in tg.allow)))
    for row in rows:
        quota = row["daily_quota"] if row["daily_quota"] is not None else default_quota
        exempt = context.services.access.exempt(row["id"], row["role"],
                                                web_admin=bool(row.get("web_admin")))
        # An admin by the configuration or the web is an admin, whatever the row says.
        role = "admin" if exempt and row["role"] != "banned" else row["role"]
        flags = [_(ROLE_WORDS.get(role, role))]
        if row["granted"]:
            flags.append(_("allowed"))
        line = _("{user} {flags} · {count} today").format(
            user=_who(row), flags=" ".join(flags),
            count=ltr(row["today"] if exempt else f"{row['today']}/{quota}"))
        lines.append(f"{line} · {_(access.NO_LIMITS)}" if exempt else line)
    if not rows:
        lines.append(_("Nobody has used the bot yet."))
    await replies.reply(update, "\n".join(lines))


WEB_ACCOUNT = N_("web account {name}")
COMMAND_LINE = N_("the command line")


def _who(row: Mapping[str, Any]) -> str:
    """A /users row's user as an admin knows them: the web account's name (with the id
    /ban and /quota take), "the command line" for `comfyveil submit`'s jobs, else the
    Telegram id."""
    code = ltr(f"<code>{row['id']}</code>")
    if row.get("web_name"):
        return _(WEB_ACCOUNT).format(name=replies.esc(row["web_name"])) + f" ({code})"
    if row["id"] == jobs.NO_CHAT:
        return _(COMMAND_LINE)
    return code


def _the_user_id(text: str, command: str) -> int:
    """The one user id `command` takes; a usage error that shows how to write it."""
    args = _args(text)
    if len(args) != 1:
        raise errors.UsageError(
            _("Write {command} and the user's id, e.g. {example}.").format(
                command=ltr(command), example=ltr(f"{command} 123456789")
            )
        )
    return _user_id(args[0], command)


async def allow(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """/allow ID: let a user use the bot (and lift a ban)."""
    user_id = _the_user_id(text, "/allow")
    await context.services.access.allow(user_id)
    await replies.reply(update, _("User {user} may use the bot now.").format(
        user=ltr(f"<code>{user_id}</code>")))


async def ban(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """/ban ID: refuse a user everywhere."""
    user_id = _the_user_id(text, "/ban")
    await context.services.access.ban(user_id)
    await replies.reply(update, _("User {user} is banned.").format(
        user=ltr(f"<code>{user_id}</code>")))


async def quota(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """/quota ID N: a user's own daily quota (/quota ID default: back to the setting)."""
    args = _args(text)
    if len(args) != 2:
        raise errors.UsageError(
            _("Write {command}, the user's id and jobs per day, e.g. {example}.").format(
                command=ltr("/quota"), example=ltr("/quota 123 50")))
    user_id = _user_id(args[0], "/quota")
    if args[1].lower() == "default":
        await context.services.db.users.set_daily_quota(user_id, None)
        await replies.reply(update, _("User {user} has the default quota again.").format(
            user=ltr(f"<code>{user_id}</code>")))
        return
    try:
        amount = int(args[1])
    except ValueError:
        raise errors.UsageError(_("The quota must be a whole number of jobs per day.")) from None
    await context.services.db.users.set_daily_quota(user_id, amount)
    answer = i18n.ngettext(
        "User {user} may run {n} job a day.",
        "User {user} may run {n} jobs a day.", amount,
    ).format(user=ltr(f"<code>{user_id}</code>"), n=ltr(amount))
    target = await context.services.db.users.get(user_id)
    if context.services.access.exempt(user_id, target.role if target else "user"):
        answer += " " + _(access.QUOTA_FOR_ADMIN).format(user=ltr(f"<code>{user_id}</code>"))
    await replies.reply(update, answer)


async def backends(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """The GPU backends: up or down, jobs on each, the queue in the database."""
    pool = context.services.pool
    queued = await context.services.db.jobs.queue_length()
    lines = [_("<b>Backends</b>"),
             _("Jobs waiting in the queue: {n}").format(n=ltr(queued))]
    if pool is None:
        lines.append(_("No worker runs in this process; see {command} on the workers.").format(
            command=ltr("`comfyveil jobs`")))
    else:
        # An admin looking is often one who just installed a model: read the lists anew.
        await pool.refresh_models(max_age=health.LOOK_REFRESH)
        entries = await context.services.commands.all()
        for backend in pool.backends.values():
            state = _("up") if backend.healthy else _("down")
            mine = i18n.ngettext("{n} job from here", "{n} jobs from here", len(backend.jobs))
            line = (f"{ltr(replies.esc(backend.name))}: {state} · "
                    f"{mine.format(n=ltr(len(backend.jobs)))} · "
                    + _("{n} in its queue").format(n=ltr(backend.remote_queue)))
            if backend.last_error and not backend.healthy:
                line += f" · {replies.esc(replies.sentence(backend.last_error))}"
            lines.append(line)
            lines += _install_lines(backend, entries)
            for estimate in pool.estimator.estimates(backend.name):
                if estimate.run is None:
                    continue
                cold = (_(", cold start +{seconds} s").format(
                    seconds=ltr(f"{estimate.cold_extra:.1f}")) if estimate.cold_extra else "")
                lines.append("  " + _("{workflow}: {seconds} s a run{cold} ({n} measured)").format(
                    workflow=ltr(replies.esc(estimate.workflow)),
                    seconds=ltr(f"{estimate.run:.1f}"), cold=cold, n=ltr(estimate.samples)))
    lines.append(_("<b>Workers</b>"))
    beats = await context.services.db.heartbeats.all(context.services.settings.worker.lease_seconds)
    for beat in beats:
        running = i18n.ngettext("{n} job running", "{n} jobs running", beat.jobs_running)
        state = _("alive") if beat.alive else _("gone")
        lines.append(f"{ltr(replies.esc(beat.worker_id))} ({ltr(replies.esc(beat.host))}): "
                     f"{state} · {running.format(n=ltr(beat.jobs_running))}")
    if not beats:
        lines.append(_("No worker has written a heartbeat yet."))
    await replies.reply(update, "\n".join(lines))


NOT_LISTED = N_("its NAME.toml lists no source for these: put them on the GPU host yourself")


def _install_lines(backend: Any, entries: list[Any]) -> list[str]:
    """Per command this GPU cannot run: what it lacks (whole file names, an admin copies
    them), and the one command that installs them on the GPU host when the workflow's
    [[models]] tables list them; every such command, as the web's backends page shows."""
    lines = []
    for entry in entries if backend.object_info is not None else []:
        problems = backend.problems(entry.workflow)
        if not problems:
            continue
        hint = model_files.install_hint(entry.workflow, problems)
        names = model_files.missing_names(problems) or problems
        how = (ltr(f"<code>{replies.esc(hint)}</code>") if hint is not None
               else _(NOT_LISTED) if model_files.missing_names(problems) else None)
        lines.append(f"  {ltr(f'/{replies.esc(entry.name)}')}: "
                     + i18n.join_list(ltr(f"<code>{replies.esc(n)}</code>") for n in names)
                     + (f"\n  {how}" if how else ""))
    return lines


async def workflows(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """/workflows, /workflows enable NAME, /workflows disable NAME."""
    services = context.services
    args = _args(text)
    if args:
        if len(args) != 2 or args[0].lower() not in ("enable", "disable"):
            raise errors.UsageError(_("Write {command}, or {enable}, or {disable}.").format(
                command=ltr("/workflows"), enable=ltr("/workflows enable NAME"),
                disable=ltr("/workflows disable NAME")))
        enabled = args[0].lower() == "enable"
        command = await services.db.commands.set_enabled(args[1].lower(), enabled)
        await services.commands.refresh()
        await commands.publish_menu(services, context.bot)
        await replies.reply(
            update, (_("{command} is on now.") if enabled else _("{command} is off now.")).format(
                command=ltr(f"/{replies.esc(command.command)}"))
        )
        return
    rows = await services.db.commands.list()
    entries = {e.name: e for e in await services.commands.all()}
    lines = [_("<b>Workflows</b>")]
    for row in rows:
        mark = _("on") if row.enabled else _("off")
        line = (f"{ltr(f'/{replies.esc(row.command)}')} {replies.esc(row.title)} · {mark} · "
                f"{_(SOURCE_WORDS.get(row.source, row.source))}")
        entry = entries.get(row.command)
        lacking = availability.missing(services.pool, entry.workflow) if entry else []
        if lacking:
            # whole names, never cut: an admin copies them to install the files
            line += " · " + _("no GPU has: {names}").format(names=i18n.join_list(
                ltr(f"<code>{replies.esc(name)}</code>") for name in lacking
            ))
        lines.append(line)
    await replies.reply(update, "\n".join(lines))


async def policy(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """/policy: the content policy in force and how many prompts it refused."""
    services = context.services
    entries = await services.commands.all()
    spoilered = [e.name for e in entries if e.workflow.spoiler]
    counts = await services.db.refusals.counts()
    await replies.reply(update, policy_view.policy_text(
        services.settings.policy, workflow_spoilers=spoilered, counts=counts,
    ))


COMMANDS: dict[str, commands.Handler] = {
    "users": users,
    "allow": allow,
    "ban": ban,
    "quota": quota,
    "backends": backends,
    "workflows": workflows,
    "policy": policy,
}
