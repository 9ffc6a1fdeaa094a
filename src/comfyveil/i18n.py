"""The bot's languages: gettext catalogs (Babel), the current user's language, RTL safety.

    from comfyveil.i18n import _, n_, N_

    with i18n.using("ru"):
        _("You have no jobs yet.")                          # "У вас пока нет заданий."
        n_("Wait {n} second.", "Wait {n} seconds.", 5).format(n=5)

Texts are English message ids in ``src/comfyveil/locale/messages.pot``; each language
has ``locale/LANG/LC_MESSAGES/messages.po``. The ``.po`` files are the only copies in the
repository: the first use of a language compiles its ``.po`` into gettext's binary form
in memory (Babel, a few milliseconds), so a fresh clone, an installed wheel and a
read-only install all work without a build step and nothing compiled can go stale.

The language is a context variable: the handler of an update (and the delivery of a
job) sets it, every ``_()`` under it reads it, and asyncio keeps it per task, so two
users writing at once each read their own language. Outside any, texts are English.

Right-to-left languages (Persian, Arabic): :func:`ltr` wraps commands, option names,
numbers and ids in Unicode LTR isolates (U+2066 ... U+2069), so ``--ar 16:9`` or
``/f`` keep their order inside a right-to-left sentence; in left-to-right languages it
returns the text unchanged.

Messages are Python format strings with named fields (``{n}``, ``{command}``); the
catalog tests check every translation keeps exactly the fields of its message id.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import functools
import gettext as gettext_module
import io
from collections.abc import Iterable, Iterator
from importlib import resources
from importlib.resources.abc import Traversable

from babel import Locale
from babel.dates import format_datetime
from babel.messages import mofile, pofile

DOMAIN = "messages"
DEFAULT = "en"
# Shipped catalogs: our language key -> Babel locale.
LANGUAGES: dict[str, str] = {
    "en": "en",
    "ru": "ru",
    "fa": "fa",
    "zh": "zh_Hans",
    "ar": "ar",
    "tr": "tr",
    "es": "es",
}
# Each language's name in itself, for /settings.
NATIVE_NAMES: dict[str, str] = {
    "en": "English",
    "ru": "Русский",
    "fa": "فارسی",
    "zh": "简体中文",
    "ar": "العربية",
    "tr": "Türkçe",
    "es": "Español",
}
RTL = frozenset({"fa", "ar"})
LRI, PDI = "\u2066", "\u2069"  # left-to-right isolate, pop directional isolate

_current: contextvars.ContextVar[str] = contextvars.ContextVar(
    "comfyveil_language", default=DEFAULT
)


def resolve(code: str | None) -> str:
    """Our language for a Telegram ``language_code`` (an IETF tag such as ``pt-br``,
    ``zh-hans``) or a stored setting; English when we have no catalog for it."""
    if not code:
        return DEFAULT
    base = code.strip().lower().replace("_", "-").split("-")[0]
    return base if base in LANGUAGES else DEFAULT


def current() -> str:
    return _current.get()


def set_language(code: str | None) -> str:
    """Make `code` (resolved) the language of this task and what it awaits; the language."""
    language = resolve(code)
    _current.set(language)
    return language


@contextlib.contextmanager
def using(code: str | None) -> Iterator[str]:
    """The language for the block, restored after it."""
    token = _current.set(resolve(code))
    try:
        yield _current.get()
    finally:
        _current.reset(token)


def catalog_path(language: str) -> Traversable:
    return resources.files("comfyveil") / "locale" / language / "LC_MESSAGES" / f"{DOMAIN}.po"


@functools.cache
def translations(language: str) -> gettext_module.NullTranslations:
    """The compiled catalog of `language` (English ids as the fallback)."""
    if language not in LANGUAGES:
        return gettext_module.NullTranslations()
    path = catalog_path(language)
    if not path.is_file():
        return gettext_module.NullTranslations()
    with path.open("rb") as handle:
        catalog = pofile.read_po(handle, locale=LANGUAGES[language], domain=DOMAIN)
    binary = io.BytesIO()
    mofile.write_mo(binary, catalog)  # fuzzy (unreviewed) entries are left out
    binary.seek(0)
    compiled = gettext_module.GNUTranslations(binary)
    compiled.add_fallback(gettext_module.NullTranslations())
    return compiled


def _(message: str) -> str:
    """`message` in the current language."""
    return translations(_current.get()).gettext(message)


def n_(singular: str, plural: str, n: int) -> str:
    """The form of `singular`/`plural` for the number `n` in the current language (Russian
    has three forms, Arabic six, Chinese one)."""
    return translations(_current.get()).ngettext(singular, plural, n)


# The standard library's names, for code that reads better with them.
gettext = _
ngettext = n_


def N_(message: str) -> str:
    """Mark `message` for extraction without translating it now (module constants are
    translated where they are used, with ``_()``)."""
    return message


def ltr(text: object) -> str:
    """`text` kept left to right inside a right-to-left message (commands, options,
    numbers, ids); unchanged in a left-to-right language."""
    value = str(text)
    if _current.get() in RTL and value:
        return f"{LRI}{value}{PDI}"
    return value


def date_time(moment: datetime.datetime) -> str:
    """A date and time as the current language writes it short ("3 Dec 09:15", "12月3日
    09:15"), in UTC like every time the bot shows."""
    return format_datetime(moment, "dd MMM HH:mm", tzinfo=datetime.UTC,
                           locale=LANGUAGES.get(_current.get(), DEFAULT))


def list_separator() -> str:
    """What goes between the items of a list in the current language: Persian and Arabic
    write the Arabic comma (، ), not a Latin one."""
    return "، " if _current.get() in RTL else ", "


def join_list(items: Iterable[str]) -> str:
    """`items` as a list the current language reads ("a, b" / "a، b")."""
    return list_separator().join(items)


def full_stop() -> str:
    """The full stop that ends a sentence in the current language (Chinese: 。)."""
    return "。" if _current.get() == "zh" else "."


def direction(language: str | None = None) -> str:
    """``rtl`` or ``ltr`` for `language` (default: the current one)."""
    lang = language or _current.get()
    return Locale.parse(LANGUAGES.get(lang, DEFAULT)).text_direction
