"""Which language a web page is in: the account's chosen language (the same settings key
as the chat's /settings, so a linked Telegram user has one choice for both), else the
browser's Accept-Language best match among the shipped catalogs, else English."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from comfyveil import i18n
from comfyveil.telegram.language import CHOICE

MAX_HEADER = 512  # a longer Accept-Language is not read past this (a peer's input)


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
