"""Which language the bot speaks to a user: their /settings choice, else the language of
their Telegram app, else English.

Telegram sends the app's ``language_code`` with every update, but not when the bot
speaks first (a result, a status edit, after a restart). So the code Telegram last
reported is kept with the user's settings (written only when it changes), and work that
outlives the update (a job's result) is remembered with the language it was asked in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from comfyveil import i18n
from comfyveil.store import users

CHOICE = "language"  # users.settings: the language chosen in /settings ("" or absent: auto)
REPORTED = "tg_language"  # users.settings: the app language Telegram last reported


def of_settings(settings: Mapping[str, Any], reported: str | None = None) -> str:
    """The user's language from their settings and, when given, the code Telegram sent."""
    choice = settings.get(CHOICE)
    if isinstance(choice, str) and choice in i18n.LANGUAGES:
        return choice
    code = reported if reported is not None else settings.get(REPORTED)
    return i18n.resolve(code if isinstance(code, str) else None)


async def note(
    user_store: users.UserStore,
    user_id: int,
    settings: Mapping[str, Any],
    reported: str | None,
) -> str:
    """Make the user's language the current one (see :mod:`comfyveil.i18n`), keeping the
    code Telegram reported when it changed; the language."""
    if reported and settings.get(REPORTED) != reported:
        await user_store.update_settings(user_id, {REPORTED: reported})
    return i18n.set_language(of_settings(settings, reported))
