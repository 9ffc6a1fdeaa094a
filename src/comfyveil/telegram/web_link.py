"""/web: a one-time link from a private chat to the web front end.

Opening it (and pressing its button) links a web account to this Telegram user, makes
one, or logs into the one already linked; the chat and the web then share one history
and one quota. The link works once, for LINK_MINUTES, and only in a private chat, where
no one else sees it.
"""

from __future__ import annotations

from telegram import LinkPreviewOptions, Update

from comfyveil.telegram import access, replies
from comfyveil.telegram.context import BotContext

LINK_MINUTES = 15


async def web(update: Update, context: BotContext, who: access.Who, text: str) -> None:
    from comfyveil.web import server
    from comfyveil.web import store as web_store

    settings = context.services.settings
    chat = update.effective_chat
    if chat is None or chat.type != "private":
        await replies.reply(update, "Send /web to me in a private chat: its link logs you in.")
        return
    if not settings.web.enabled:
        await replies.reply(update, "The web front end is not enabled here.")
        return
    token = await web_store.WebStore(context.services.db.pool).create_link(
        who.user_id, minutes=LINK_MINUTES
    )
    url = f"{server.link_base(settings)}/link/{token}"
    await replies.reply(
        update,
        f"Open this within {LINK_MINUTES} minutes, once, to use the web front end with "
        f"your Telegram account (one history for both):\n{replies.esc(url)}",
        link_preview_options=LinkPreviewOptions(is_disabled=True),
    )
