"""Which language a user reads.

In the chat: their /settings choice, else the language of their Telegram app, else
English. On a web page: the account's chosen language (the same settings key as the
chat's /settings, so a linked Telegram user has one choice for both), else the browser's
Accept-Language best match among the shipped catalogs, else English.

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
MAX_HEADER = 512  # a longer Accept-Language is not read past this (a peer's input)


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


def from_accept_language(header: str | None) -> str:
    """The shipped language the browser prefers most (q-values honoured); English if none."""
    best, best_q = i18n.DEFAULT, 0.0
    for position, part in enumerate((header or "")[:MAX_HEADER].split(",")):
        tag, _sep, params = part.strip().partition(";")
        code = tag.strip().lower().replace("_", "-").split("-")[0]
        if code not in i18n.LANGUAGES:
            continue
        q = 1.0
        for param in params.split(";"):
            name, _eq, value = param.strip().partition("=")
            if name.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        # Equal weights: the earlier tag wins (a tiny penalty by position keeps it so).
        score = q - position * 1e-6
        if q > 0 and score > best_q:
            best, best_q = code, score
    return best


def choose(settings: Mapping[str, Any] | None, accept_language: str | None) -> str:
    """The page's language: the account's choice, else the browser's, else English."""
    choice = (settings or {}).get(CHOICE)
    if isinstance(choice, str) and choice in i18n.LANGUAGES:
        return choice
    return from_accept_language(accept_language)


def choices() -> list[tuple[str, str]]:
    """(value, label) of the settings page's language select: each language in itself."""
    return [(code, i18n.NATIVE_NAMES[code]) for code in i18n.LANGUAGES]
