"""The update router: who is writing, which command, which handler.

Commands come as text or as a photo's caption (``/qwen make it night`` on a photo), and
the workflow commands are rows of a table that operators change while the bot runs, so
one message handler routes them all instead of one ``CommandHandler`` each.

In groups the bot answers only commands: plain messages are never its business, and a
command addressed to another bot (``/f@OtherBot``) is not for us. Unknown commands are
answered in private chats, and in groups only when addressed to us by name.
"""

from __future__ import annotations

import logging

from telegram import Update
from telegram.error import TelegramError

from comfyveil import i18n
from comfyveil.desk import availability, language
from comfyveil.i18n import N_, _, ltr
from comfyveil.telegram import admin, commands, parse, replies
from comfyveil.telegram.context import BotContext, Services

logger = logging.getLogger(__name__)

# What users read, in one place (to be translated as a whole).
HINT = N_("Send a command, such as {example}. {help} lists them all.")
HINT_NO_EXAMPLE = N_("Send a command. {help} lists them all.")
PHOTO_HINT = N_(
    "To edit this photo, send it with a caption such as {example}, or reply to it with the "
    "command."
)
PHOTO_HINT_NONE = N_("No command that edits photos can run right now; {help} lists what can.")


async def _hint(services: Services, photo: bool) -> str:
    """A hint naming a command some GPU can run now (one that edits, for a photo)."""
    # not per user: an admins-only command is never the example (hints come before access)
    entries = [e for e in await commands.runnable_entries(services) if not e.admins_only]
    if photo:
        edits = availability.edits(services.pool, entries)
        if not edits:
            return _(PHOTO_HINT_NONE).format(help=ltr("/help"))
        shown = f"/{replies.esc(edits[0].name)}"
        if edits[0].workflow.prompt_param is not None:
            shown += " " + replies.esc(_("make it night"))
        return _(PHOTO_HINT).format(example=ltr(f"<code>{shown}</code>"))
    texts = [e for e in entries if not e.takes_image]
    if not texts:
        return _(HINT_NO_EXAMPLE).format(help=ltr("/help"))
    shown = f"/{replies.esc(texts[0].name)} " + replies.esc(_("a red fox"))
    return _(HINT).format(example=ltr(f"<code>{shown}</code>"), help=ltr("/help"))


@replies.plain_errors
async def on_message(update: Update, context: BotContext) -> None:
    """Every message: route a command, or give a hint in private chats."""
    message = update.effective_message
    chat = update.effective_chat
    user = update.effective_user
    if message is None or chat is None or user is None or user.is_bot:
        return
    services = context.services
    i18n.set_language(user.language_code)  # until we know the user's own choice
    text = message.text or message.caption or ""
    in_group = chat.type != "private"
    split = parse.split_command(text, bot_username=services.bot_username, in_group=in_group)
    if split is None:
        if not in_group:
            await replies.reply(update, await _hint(services, bool(message.photo)))
        return
    name = split[0]
    first = text.lstrip().split(maxsplit=1)[0].lower()
    addressed = bool(services.bot_username) and first.endswith(
        "@" + services.bot_username.lower()
    )
    handler = commands.COMMANDS.get(name)
    admin_handler = admin.COMMANDS.get(name)
    entry = None
    if handler is None and admin_handler is None:
        entry = await services.commands.get(name)
        if entry is None:
            if not in_group or addressed:
                stored = await services.db.commands.get(name)
                if stored is not None and not stored.enabled:
                    answer = _("{command} is switched off.").format(
                        command=ltr(f"/{replies.esc(name)}"))
                else:
                    answer = _("There is no command {command}. {help} lists them all.").format(
                        command=ltr(f"/{replies.esc(name)}"), help=ltr("/help"))
                await replies.reply(update, answer)
            return
    who = await services.access.require(user.id, chat.id)
    await language.note(services.db.users, user.id, who.settings, user.language_code)
    if admin_handler is not None:
        services.access.require_admin(who)
        await admin_handler(update, context, who, text)
    elif handler is not None:
        await handler(update, context, who, text)
    else:
        assert entry is not None
        await commands.run_workflow(update, context, who, entry, text)


async def on_error(update: object, context: BotContext) -> None:
    """Log what went wrong (never the message text) and apologise in one sentence."""
    error = context.error
    if error is None:
        return
    logger.error("handling an update failed: %s", type(error).__name__, exc_info=error,
                 extra={"action": "update_failed"})
    if isinstance(update, Update) and update.effective_chat is not None:
        try:
            if update.callback_query is not None:
                await update.callback_query.answer(_(replies.INTERNAL), show_alert=True)
            else:
                await replies.reply(update, _(replies.INTERNAL))
        except TelegramError:
            pass
