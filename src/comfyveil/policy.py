"""The operator's content policy: prompts refused, results behind a spoiler (``[policy]``).

    [policy]
    terms = ["gore", "behead*"]        # words and phrases refused in every command's prompt
    patterns = ['\\bkill(ed|ing)?\\s+(him|her)\\b']   # regular expressions, likewise
    spoiler = false                    # every result behind a spoiler
    spoiler_chats = [-1001234567890]   # chats whose results are always behind a spoiler

    [policy.commands.wan]              # one command: its own terms, patterns and spoiler
    terms = ["blood"]
    spoiler = true

Matching works on folded text (:mod:`comfyveil.textfold`): NFKC, invisible characters
removed, accents removed, look-alike letters as Latin, case folded. A term matches a whole
word or phrase (``*`` at either end: any word continuing it, so ``behead*`` matches
"beheading"); a term in a script written without spaces (Chinese, Japanese, Thai ...)
matches anywhere. A pattern is searched for in the folded text, case-insensitively. Both
also see more views: runs of single letters glued (``g o r e``, ``(g)(o)(r)(e)``),
punctuation between letters dropped (``go:re``), digits read as letters where letters
stand on both sides (``g0re``; not ``2000s``).

What is checked is what the user writes for the workflow to draw: the prompt and the
values of the workflow's own options, not the negative prompt (``--no gore`` asks for
less of it). Refusals are counted per day and command, never with their text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from comfyveil import errors, textfold
from comfyveil.i18n import N_

MAX_TERMS = 10_000
MAX_PATTERN_CHARS = 1000
# Scripts written without spaces between words: a term there matches inside text.
_UNSPACED = re.compile(
    "[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uf900-\ufaff\U00020000-\U0003134f]"
)


class PromptRefused(errors.UsageError):
    """This bot does not accept that prompt; nothing was queued."""


# The refusal's sentence, for the catalogs (the chat translates it where it is shown).
REFUSAL = N_("This bot does not accept that prompt; nothing was queued.")


@dataclass(frozen=True)
class Rules:
    """Terms and patterns as the operator wrote them, and whether results are hidden."""

    terms: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    spoiler: bool = False


@dataclass(frozen=True)
class PolicyConfig:
    """``[policy]``: rules for every command, rules per command, spoiler chats."""

    common: Rules = field(default_factory=Rules)
    commands: Mapping[str, Rules] = field(default_factory=lambda: MappingProxyType({}))
    spoiler_chats: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return (
            not (self.common.terms or self.common.patterns or self.common.spoiler)
            and not self.commands
            and not self.spoiler_chats
        )


def _strings(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise errors.ConfigError(f"{key} must be a list of strings")
    if len(value) > MAX_TERMS:
        raise errors.ConfigError(f"{key} has more than {MAX_TERMS} entries")
    return tuple(v for v in value if v.strip())


def _rules(table: Any, where: str, extra: Iterable[str] = ()) -> Rules:
    if not isinstance(table, Mapping):
        raise errors.ConfigError(f"[{where}] must be a table")
    allowed = {"terms", "patterns", "spoiler", *extra}
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise errors.ConfigError(f"unknown key(s) in [{where}]: {', '.join(unknown)}")
    spoiler = table.get("spoiler", False)
    if not isinstance(spoiler, bool):
        raise errors.ConfigError(f"{where}.spoiler must be true or false")
    patterns = _strings(table.get("patterns", []), f"{where}.patterns")
    for pattern in patterns:
        _compile_pattern(pattern, where)
    for term in _strings(table.get("terms", []), f"{where}.terms"):
        if not textfold.fold(term).strip("* "):
            raise errors.ConfigError(f"{where}.terms: {term!r} has no letters to match")
    return Rules(
        terms=_strings(table.get("terms", []), f"{where}.terms"),
        patterns=patterns,
        spoiler=spoiler,
    )


def from_table(table: Any) -> PolicyConfig:
    """Read ``[policy]`` from parsed TOML.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, a pattern that does not
            compile.
    """
    if table is None:
        return PolicyConfig()
    common = _rules(table, "policy", extra=("commands", "spoiler_chats"))
    raw_commands = table.get("commands", {})
    if not isinstance(raw_commands, Mapping):
        raise errors.ConfigError("[policy.commands] must be a table of commands")
    commands = {
        str(name).lower().lstrip("/"): _rules(rules, f"policy.commands.{name}")
        for name, rules in raw_commands.items()
    }
    chats = table.get("spoiler_chats", [])
    if not isinstance(chats, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) for c in chats
    ):
        raise errors.ConfigError("policy.spoiler_chats must be a list of numeric chat ids")
    return PolicyConfig(
        common=common, commands=MappingProxyType(commands), spoiler_chats=tuple(chats)
    )


def _compile_pattern(pattern: str, where: str) -> re.Pattern[str]:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise errors.ConfigError(
            f"{where}.patterns: a pattern is longer than {MAX_PATTERN_CHARS} characters"
        )
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise errors.ConfigError(
            f"{where}.patterns: {pattern[:60]!r} is not a valid regular expression ({exc})"
        ) from exc


def _term_regex(term: str) -> str:
    """The term as a prompt may hold it: folded, and with every look-alike letter as
    Latin (what a word of real Cyrillic with a Latin letter in it folds to)."""
    forms = dict.fromkeys(
        _form_regex(textfold.fold(term, every_lookalike=every)) for every in (False, True)
    )
    return "|".join(forms)


def _form_regex(folded: str) -> str:
    head = folded.startswith("*")
    tail = folded.endswith("*")
    core = folded.strip("* ")
    body = r"\s+".join(re.escape(word) for word in core.split())
    if _UNSPACED.search(core):
        return body
    return (r"\w*" if head else r"(?<!\w)") + body + (r"\w*" if tail else r"(?!\w)")


class _Matcher:
    """One compiled alternation of terms plus the patterns, for one set of rules."""

    def __init__(self, rules: Iterable[Rules]) -> None:
        terms = sorted({t for r in rules for t in r.terms}, key=len, reverse=True)
        self.terms = re.compile("|".join(_term_regex(t) for t in terms)) if terms else None
        self.patterns = [
            _compile_pattern(p, "policy")
            for p in dict.fromkeys(p for r in rules for p in r.patterns)
        ]

    def matches(self, views: Iterable[str]) -> bool:
        for view in views:
            if self.terms is not None and self.terms.search(view):
                return True
            if any(p.search(view) for p in self.patterns):
                return True
        return False


class Policy:
    """The compiled ``[policy]``: asks whether a prompt is refused, and whether a result
    goes behind a spoiler."""

    def __init__(self, cfg: PolicyConfig | None = None) -> None:
        self.config = cfg or PolicyConfig()
        self._common = _Matcher([self.config.common])
        self._per_command = {
            name: _Matcher([self.config.common, rules])
            for name, rules in self.config.commands.items()
        }

    def refuses(self, command: str, texts: Iterable[str]) -> bool:
        """Whether any of `texts` (a prompt, option values) holds a refused term or
        pattern for `command`."""
        matcher = self._per_command.get(command.lower(), self._common)
        if matcher.terms is None and not matcher.patterns:
            return False
        views: list[str] = []
        for text in texts:
            if not text:
                continue
            folded = textfold.fold(text)
            found = [folded, textfold.joined(folded), textfold.squeezed(folded)]
            for view in found[:]:
                found.extend(textfold.unleet(view))
            views.extend(dict.fromkeys(found))
        return matcher.matches(views)

    def check(self, command: str, texts: Iterable[str]) -> None:
        """Raises PromptRefused when :meth:`refuses` says so."""
        if self.refuses(command, texts):
            raise PromptRefused()

    def spoiler(self, command: str, chat_id: int, *, workflow_spoiler: bool = False) -> bool:
        """Whether the operator hides `command`'s results in `chat_id` behind a spoiler
        (the workflow's own ``spoiler = true``, ``[policy]`` for all, for the command, or
        for the chat)."""
        rules = self.config.commands.get(command.lower())
        return (
            workflow_spoiler
            or self.config.common.spoiler
            or (rules is not None and rules.spoiler)
            or chat_id in self.config.spoiler_chats
        )
