"""/web: a one-time link from a private chat to the web front end.

Opening it (and pressing its button) links a web account to this Telegram user, makes
one, or logs into the one already linked; the chat and the web then share one history
and one quota. The link works once, for LINK_MINUTES, and only in a private chat, where
no one else sees it.
"""

from __future__ import annotations

from telegram import LinkPreviewOptions, Update

from comfyveil.desk import access, links
from comfyveil.i18n import _, ltr, n_
from comfyveil.telegram import replies
from comfyveil.telegram.context import BotContext


async def web(update: Update, context: BotContext, who: access.Who, text: str) -> None:

    settings = context.services.settings
    chat = update.effective_chat
    if chat is None or chat.type != "private":
        await replies.reply(update, _("Send {command} to me in a private chat: its link logs "
                                      "you in.").format(command=ltr("/web")))
        return
    if not settings.web.enabled:
        await replies.reply(update, _("The web front end is not enabled here."))
        return
    url = await links.web_link(settings, context.services.db.pool, who.user_id)
    await replies.reply(
        update,
        n_("Open this within {n} minute, once, to use the web front end with your Telegram "
           "account (one history for both):\n{url}",
           "Open this within {n} minutes, once, to use the web front end with your Telegram "
           "account (one history for both):\n{url}", links.LINK_MINUTES,
           ).format(n=ltr(links.LINK_MINUTES), url=ltr(replies.esc(url))),
        link_preview_options=LinkPreviewOptions(is_disabled=True),
    )
