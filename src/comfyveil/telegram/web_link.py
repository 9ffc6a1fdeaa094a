"""/web: a one-time link from a private chat to the web front end, and /web CODE.

Opening the link (and pressing its button) makes a web account for this Telegram user,
or logs into the one already linked with that account's passphrase; it never links an
account someone is signed in to, since whoever sent /web may not be its owner. The link
works once, for LINK_MINUTES, and only in a private chat, where no one else sees it.

Linking an existing web account starts on the web: its Settings page shows a short
code, and ``/web CODE`` sent from the owner's own Telegram links the two; the chat and
the web then share one history and one quota (issue 22 §2).
"""

from __future__ import annotations

from telegram import LinkPreviewOptions, Update

from comfyveil.desk import access, links
from comfyveil.i18n import _, ltr, n_
from comfyveil.store import accounts
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
    code = text.strip().partition(" ")[2].strip()
    if code:
        await _link_with_code(update, context, who, code)
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


async def _link_with_code(update: Update, context: BotContext, who: access.Who,
                          code: str) -> None:
    """``/web CODE``: link the web account whose Settings page showed `code` to the
    Telegram user who sent it."""
    try:
        account = await links.link_by_code(context.services.db.pool, code, who.user_id)
    except (accounts.NameTaken, accounts.InviteInvalid) as exc:
        await replies.reply(update, _(str(exc)))
        return
    if account is None:
        await replies.reply(update, _("That code is not valid (it lasts 15 minutes and works "
                                      "once); open Settings on the web page for a new one."))
        return
    await replies.reply(update, _("Your Telegram account is now linked to the web account "
                                  "{name}: the chat and the web show one history.").format(
                                      name=replies.esc(account.name)))
