"""Admin commands: /users, /allow ID, /ban ID, /quota ID N, /backends, /workflows, /policy.

Admins are the ids in ``[telegram] admins`` and users with the ``admin`` role.
"""

from __future__ import annotations

from telegram import Update

from comfyveil import errors, i18n
from comfyveil.telegram import access, availability, commands, policy_view, replies
from comfyveil.telegram.context import BotContext

USERS_SHOWN = 40

def _args(text: str) -> list[str]:
    return text.split()[1:]


def _user_id(word: str) -> int:
    try:
        return int(word)
    except ValueError:
        raise errors.UsageError(f"{word[:20]!r} is not a Telegram user id (a number).") from None


async def users(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """Known users with role, quota and today's jobs."""
    tg = context.services.settings.telegram
    rows = await context.services.db.users.overview(limit=USERS_SHOWN)
    default_quota = context.services.settings.limits.daily_quota
    lines = ["<b>Users</b>",
             f"Mode: {'open to everyone' if tg.open else 'allow-list'}; admins from config: "
             f"{', '.join(map(str, tg.admins)) or 'none'}"]
    if tg.allow:
        lines.append(f"Allowed in config: {', '.join(map(str, tg.allow))}")
    for row in rows:
        quota = row["daily_quota"] if row["daily_quota"] is not None else default_quota
        flags = [row["role"]]
        if row["granted"]:
            flags.append("allowed")
        lines.append(f"<code>{row['id']}</code> {' '.join(flags)} · {row['today']}/{quota} today")
    if not rows:
        lines.append("Nobody has used the bot yet.")
    await replies.reply(update, "\n".join(lines))


async def allow(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """/allow ID: let a user use the bot (and lift a ban)."""
    args = _args(text)
    if len(args) != 1:
        raise errors.UsageError("Write /allow and the user's id, e.g. /allow 123456789.")
    user_id = _user_id(args[0])
    await context.services.access.allow(user_id)
    await replies.reply(update, f"User <code>{user_id}</code> may use the bot now.")


async def ban(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """/ban ID: refuse a user everywhere."""
    args = _args(text)
    if len(args) != 1:
        raise errors.UsageError("Write /ban and the user's id, e.g. /ban 123456789.")
    user_id = _user_id(args[0])
    await context.services.access.ban(user_id)
    await replies.reply(update, f"User <code>{user_id}</code> is banned.")


async def quota(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """/quota ID N: a user's own daily quota (/quota ID default: back to the setting)."""
    args = _args(text)
    if len(args) != 2:
        raise errors.UsageError("Write /quota, the user's id and jobs per day, e.g. /quota 123 50.")
    user_id = _user_id(args[0])
    if args[1].lower() == "default":
        await context.services.db.users.set_daily_quota(user_id, None)
        await replies.reply(update, f"User <code>{user_id}</code> has the default quota again.")
        return
    try:
        amount = int(args[1])
    except ValueError:
        raise errors.UsageError("The quota must be a whole number of jobs per day.") from None
    await context.services.db.users.set_daily_quota(user_id, amount)
    await replies.reply(update, i18n.ngettext(
        "User <code>{user}</code> may run {n} job a day.",
        "User <code>{user}</code> may run {n} jobs a day.", amount,
    ).format(user=user_id, n=amount))


async def backends(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """The GPU backends: up or down, jobs on each, the queue in the database."""
    pool = context.services.pool
    queued = await context.services.db.jobs.queue_length()
    lines = ["<b>Backends</b>", f"Jobs waiting in the queue: {queued}"]
    if pool is None:
        lines.append("No worker runs in this process; see `comfyveil jobs` on the workers.")
    else:
        for backend in pool.backends.values():
            state = "up" if backend.healthy else "down"
            line = (f"{replies.esc(backend.name)}: {state} · {len(backend.jobs)} job(s) from here"
                    f" · {backend.remote_queue} in its queue")
            if backend.last_error and not backend.healthy:
                line += f" · {replies.esc(replies.sentence(backend.last_error))}"
            lines.append(line)
            for estimate in pool.estimator.estimates(backend.name):
                if estimate.run is None:
                    continue
                cold = (f", cold start +{estimate.cold_extra:.1f} s"
                        if estimate.cold_extra else "")
                lines.append(f"  {replies.esc(estimate.workflow)}: {estimate.run:.1f} s a run"
                             f"{cold} ({estimate.samples} measured)")
    await replies.reply(update, "\n".join(lines))


async def workflows(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    """/workflows, /workflows enable NAME, /workflows disable NAME."""
    services = context.services
    args = _args(text)
    if args:
        if len(args) != 2 or args[0].lower() not in ("enable", "disable"):
            raise errors.UsageError("Write /workflows, or /workflows enable NAME, or "
                                    "/workflows disable NAME.")
        enabled = args[0].lower() == "enable"
        command = await services.db.commands.set_enabled(args[1].lower(), enabled)
        await services.commands.refresh()
        await commands.publish_menu(services, context.bot)
        await replies.reply(
            update, f"/{replies.esc(command.command)} is {'on' if enabled else 'off'} now."
        )
        return
    rows = await services.db.commands.list()
    entries = {e.name: e for e in await services.commands.all()}
    lines = ["<b>Workflows</b>"]
    for row in rows:
        mark = "on" if row.enabled else "off"
        line = f"/{replies.esc(row.command)} {replies.esc(row.title)} · {mark} · {row.source}"
        entry = entries.get(row.command)
        lacking = availability.missing(services.pool, entry.workflow) if entry else []
        if lacking:
            # whole names, never cut: an admin copies them to install the files
            line += " · no GPU has: " + ", ".join(
                f"<code>{replies.esc(name)}</code>" for name in lacking
            )
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
