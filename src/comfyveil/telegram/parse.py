"""Parse a chat command into a prompt, a negative prompt and options (pure).

Syntax, as the /help text explains it to users::

    /f a fox in snow --seed 42 --steps 4 --ar 16:9 --no blurry, text
    /f@MyBot a fox --steps=4 --style "oil painting"
    /cancel 3f2a9c1d

- The command may carry the bot's username (``/f@MyBot``). In groups a command addressed
  to another bot is not ours and :func:`split_command` returns None; in a private chat
  the user can only be talking to us, so the suffix is ignored.
- Options are ``--name value`` or ``--name=value``; a value with spaces is quoted
  (``"..."``, ``'...'`` or typographic quotes). Phones turn ``--`` into ``—``; that is
  accepted too. Names are case-insensitive and ``-``/``_`` are the same.
- The negative prompt is the one option whose value runs on: ``--no`` takes every word up
  to the next option or the end (``--no blurry, text, watermark``). This is the only
  negative syntax.
- Words that are not options form the prompt, in order.
- Front-end options are always allowed: ``--ar W:H`` (aspect ratio) and ``--file``
  (send the result as a file, full quality). Everything else must be one of the workflow
  parameters passed in ``allowed_options``.
- A job reference as the first word, ``#`` and 8 to 32 hex digits (an id prefix) or a
  whole UUID, becomes :attr:`ParsedCommand.target_job`, e.g. ``/cancel #3f2a9c1d``. The
  ``#`` keeps prompts such as ``/f 20240101 poster`` from being read as a job.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from comfyveil import i18n

# The chat's ``--ar`` follows the desk's one aspect rule, and the chat's refusals are the
# desk's error for a command's options (the rule raises it): named here as the chat's.
from comfyveil.desk.options import MAX_ASPECT as MAX_ASPECT
from comfyveil.desk.options import OptionError as ParseError
from comfyveil.desk.options import aspect_to_size as aspect_to_size
from comfyveil.desk.options import parse_aspect
from comfyveil.i18n import N_, _, ltr

NEGATIVE_OPTION = "no"
ASPECT_OPTION = "ar"
FILE_OPTION = "file"
FRONT_END_OPTIONS: Mapping[str, str] = {
    ASPECT_OPTION: N_("aspect ratio, e.g. 16:9"),
    FILE_OPTION: N_("send the result as a file, without recompression"),
}
FLAG_VALUES = {"yes": "yes", "true": "yes", "on": "yes", "1": "yes",
               "no": "no", "false": "no", "off": "no", "0": "no"}  # fmt: skip
MAX_PROMPT_CHARS = 2000

_COMMAND = re.compile(r"^/([A-Za-z0-9_]{1,32})(?:@([A-Za-z0-9_]{3,64}))?(?=\s|$)")
# An option's name starts with a letter of any script: "--шаги 3" is an option the
# command lacks (refused, with the allowed ones), not four characters of the prompt.
_OPTION = re.compile(r"(?:(?<=\s)|^)(?:--|—|–)([^\W\d_][\w-]*)(?==|\s|$)")
_JOB_REF = re.compile(
    r"#?([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"
    r"|#([0-9a-fA-F]{8,32})"
)
# A word that starts with one hyphen or a dash we do not read as "--" (a phone's minus, a
# figure dash): if an option's name follows, the user meant that option.
_NEAR_OPTION = re.compile(r"(?:(?<=\s)|^)[-‐‑‒―−﹘﹣－]+([A-Za-z][A-Za-z0-9_-]*)(?==|\s|$)")
_QUOTES = {'"': '"', "'": "'", "“": "”", "„": "“", "«": "»", "‘": "’"}


@dataclass(frozen=True)
class ParsedCommand:
    """A command message, taken apart.

    Attributes:
        command: the command name, lower case, without ``/`` or ``@bot``.
        prompt: the words that are not options, whitespace collapsed ("" if none).
        negative: the ``--no`` text, or None when not given.
        options: option name (as spelled in ``allowed_options``) -> raw value; flags
            such as ``file`` have the value "yes" or "no".
        target_job: a job id or id prefix named as the first word, lower case, or None.
    """

    command: str
    prompt: str
    negative: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    target_job: str | None = None


def split_command(
    text: str, *, bot_username: str | None = None, in_group: bool = False
) -> tuple[str, str] | None:
    """Return ``(command, rest)`` when ``text`` is a command for us, else None."""
    match = _COMMAND.match(text.lstrip())
    if match is None:
        return None
    addressed = match.group(2)
    if (
        addressed
        and in_group
        and (bot_username is None or addressed.lower() != bot_username.lower().lstrip("@"))
    ):
        return None
    return match.group(1).lower(), text.lstrip()[match.end() :].strip()


def parse(
    text: str,
    allowed_options: Mapping[str, str],
    *,
    bot_username: str | None = None,
    in_group: bool = False,
    require_prompt: bool = False,
    takes_prompt: bool = True,
    negative_allowed: bool = True,
    max_prompt_chars: int = MAX_PROMPT_CHARS,
) -> ParsedCommand | None:
    """Parse a command message.

    Args:
        text: the message text or caption.
        allowed_options: the workflow's options, name -> one-line description.
        bot_username: our username, to recognise ``/cmd@OurBot`` in groups.
        in_group: the message comes from a group, where ``/cmd@OtherBot`` is ignored.
        require_prompt: refuse a command without a prompt (generation commands).
        takes_prompt: False for a command that takes no words (an edit without a prompt):
            words given to it are refused, not dropped.
        negative_allowed: whether ``--no`` is accepted (the workflow has a negative input).
        max_prompt_chars: the longest prompt (and negative prompt) accepted.

    Returns:
        The parsed command, or None when the text is not a command for this bot.

    Raises:
        ParseError: with one sentence saying what is wrong and what is allowed.
    """
    split = split_command(text, bot_username=bot_username, in_group=in_group)
    if split is None:
        return None
    command, rest = split
    allowed = _allowed(allowed_options, negative_allowed)
    words: list[str] = []
    negative: str | None = None
    options: dict[str, str] = {}
    position = 0
    matches = list(_OPTION.finditer(rest))
    target_job: str | None = None
    for index, match in enumerate(matches):
        words.append(rest[position : match.start()])
        name = _canonical(match.group(1), allowed, command)
        if name in options or (name == NEGATIVE_OPTION and negative is not None):
            raise ParseError(_("The option {option} is given twice.").format(
                option=ltr(f"--{name}")))
        end = matches[index + 1].start() if index + 1 < len(matches) else len(rest)
        value_text = rest[match.end() : end]
        if name == NEGATIVE_OPTION:
            negative = _unquote_all(value_text.lstrip("=").strip())
            if not negative:
                raise ParseError(_("Write the negative prompt after {no}, e.g. {example}.").format(
                    no=ltr("--no"), example=ltr(_("--no blurry, text"))))
            position = end
            continue
        value, consumed = _take_value(value_text, name)
        options[name] = value
        position = match.end() + consumed
    words.append(rest[position:])
    for stray in words:  # "-width 100", "−seed 4": an option with the wrong dash
        for near in _NEAR_OPTION.finditer(stray):
            known = allowed.get(_key(near.group(1)))
            if known is not None:
                raise ParseError(_("Write options with two hyphens: {option}, not {given}.")
                                 .format(option=ltr(f"--{known}"),
                                         given=ltr(near.group(0).strip())))
    prompt = " ".join(" ".join(words).split())
    first, _space, remainder = prompt.partition(" ")
    if (job := _JOB_REF.fullmatch(first)) is not None:
        target_job = (job.group(1) or job.group(2)).lower()
        prompt = remainder
    if ASPECT_OPTION in options:
        parse_aspect(options[ASPECT_OPTION])
    too_long = (
        (prompt, N_("The prompt is {length} characters long; the limit is {limit}.")),
        (negative or "", N_("The negative prompt is {length} characters long; the limit is "
                            "{limit}.")),
    )
    for value, message in too_long:
        if len(value) > max_prompt_chars:
            raise ParseError(_(message).format(length=ltr(len(value)),
                                               limit=ltr(max_prompt_chars)))
    if prompt and not takes_prompt:
        raise ParseError(_("{command} takes no words, only its options: {words} would be "
                           "lost.").format(command=ltr(f"/{command}"),
                                           words=ltr(repr(prompt[:40]))))
    if require_prompt and not prompt:
        raise ParseError(_("Write a prompt after {command}, for example: {example}.").format(
            command=ltr(f"/{command}"), example=ltr(f"/{command}") + " " + _("a red fox")))
    return ParsedCommand(command, prompt, negative, options, target_job)


def _allowed(allowed_options: Mapping[str, str], negative_allowed: bool) -> dict[str, str]:
    allowed = {_key(name): name for name in allowed_options}
    for name in FRONT_END_OPTIONS:
        allowed.setdefault(_key(name), name)
    if negative_allowed:
        allowed.setdefault(_key(NEGATIVE_OPTION), NEGATIVE_OPTION)
    return allowed


def _key(name: str) -> str:
    return name.lower().replace("-", "_")


def _canonical(spelled: str, allowed: dict[str, str], command: str) -> str:
    name = allowed.get(_key(spelled))
    if name is not None:
        return name
    if _key(spelled) == NEGATIVE_OPTION:
        raise ParseError(_("{command} has no negative prompt, so {no} cannot be used.").format(
            command=ltr(f"/{command}"), no=ltr("--no")))
    listed = i18n.join_list(ltr(f"--{n}") for n in sorted(allowed.values()))
    close = difflib.get_close_matches(_key(spelled), list(allowed), n=1)
    if close:
        raise ParseError(_("{command} has no option {option}. Did you mean {close}? Allowed: "
                           "{allowed}.").format(command=ltr(f"/{command}"),
                                                option=ltr(f"--{spelled}"),
                                                close=ltr(f"--{allowed[close[0]]}"),
                                                allowed=listed))
    raise ParseError(_("{command} has no option {option}. Allowed: {allowed}.").format(
        command=ltr(f"/{command}"), option=ltr(f"--{spelled}"), allowed=listed))


def _take_value(text: str, name: str) -> tuple[str, int]:
    """Read one option value from the start of ``text``; return it and chars consumed."""
    stripped = text.lstrip()
    skipped = len(text) - len(stripped)
    if stripped.startswith("="):
        stripped = stripped[1:]
        skipped += 1
    if stripped[:1] in _QUOTES:
        closing = _QUOTES[stripped[0]]
        end = stripped.find(closing, 1)
        if end < 0:
            raise ParseError(_("The quote after {option} is never closed.").format(
                option=ltr(f"--{name}")))
        return stripped[1:end], skipped + end + 1
    word = stripped.split(maxsplit=1)[0] if stripped.strip() else ""
    if name == FILE_OPTION:
        flag = FLAG_VALUES.get(word.lower())
        if flag is None and word and stripped.strip() == word:
            # "--file maybe" at the end: meant as its value, not as a word of the prompt
            raise ParseError(_("{option} is {yes} or {no}, or nothing; not {value}.").format(
                option=ltr(f"--{name}"), yes=ltr("yes"), no=ltr("no"),
                value=ltr(repr(word[:20]))))
        return (flag, skipped + len(word)) if flag else ("yes", 0)
    if not word:
        raise ParseError(_("The option {option} needs a value, e.g. {example}.").format(
            option=ltr(f"--{name}"), example=ltr(f"--{name} 4")))
    return word, skipped + len(word)


def _unquote_all(text: str) -> str:
    if len(text) >= 2 and text[0] in _QUOTES and text.endswith(_QUOTES[text[0]]):
        text = text[1:-1]
    return " ".join(text.split())
