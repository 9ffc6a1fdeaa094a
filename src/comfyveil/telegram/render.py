"""Turn job state into the text users see in chat (pure).

Every function returns Telegram HTML (send with ``parse_mode="HTML"``): user-supplied and
stored text is escaped, and the result fits Telegram's limits (4096 characters for a
message, 1024 for a caption, counted after HTML parsing; we count the markup too, which
only errs on the safe side). Inputs are small frozen dataclasses defined here, so the bot
can map store rows onto them without this module knowing the store.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

MAX_MESSAGE_CHARS = 4096
MAX_CAPTION_CHARS = 1024
MAX_ERROR_CHARS = 300
SHORT_ID_CHARS = 8
DOT = " · "

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]

_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*File \"", re.MULTILINE)


@dataclass(frozen=True)
class JobView:
    """What the chat shows about one job.

    Attributes:
        progress: 0.0 to 1.0, or None before the backend reports any.
        eta_s: estimated seconds until the result (queued) or None when unknown.
        elapsed_s: run time on the GPU, for the result caption.
        waited_s: time in the queue before that.
        error: the plain sentence to show when the job failed.
    """

    id: str
    command: str
    status: JobStatus
    position: int | None = None
    eta_s: float | None = None
    backend: str | None = None
    progress: float | None = None
    step: int | None = None
    steps: int | None = None
    seed: int | None = None
    elapsed_s: float | None = None
    error: str | None = None
    waited_s: float | None = None  # from queueing to its start, for the result caption
    running_s: float | None = None  # since it started, for the status message


@dataclass(frozen=True)
class OptionHelp:
    name: str
    description: str
    minimum: float | None = None
    maximum: float | None = None
    default: str | float | None = None


@dataclass(frozen=True)
class CommandHelp:
    name: str
    title: str
    description: str = ""
    options: Sequence[OptionHelp] = field(default_factory=tuple)
    takes_image: bool = False


@dataclass(frozen=True)
class HistoryEntry:
    id: str
    command: str
    prompt: str
    status: JobStatus
    created_at: datetime
    seed: int | None = None
    elapsed_s: float | None = None


def short_id(job_id: str) -> str:
    """The id prefix users type to name a job (``/cancel #3f2a9c1d``)."""
    return job_id.replace("-", "")[:SHORT_ID_CHARS].lower()


def duration(seconds: float) -> str:
    """``3.1 s``, ``40 s``, ``3 min``, ``1 h 5 min``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{round(seconds)} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def clock(seconds: float) -> str:
    """Elapsed time in whole seconds, as a status shows it: ``7 s``, ``2 min 05 s``."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    return f"{minutes} min {rest:02d} s"


def plain_error(error: str | None) -> str:
    """One sentence from an error text: never a traceback, never a wall of text."""
    text = (error or "").strip()
    if not text or _TRACEBACK.search(text):
        return "The job failed."
    sentence = " ".join(text.splitlines()[0].split())
    if len(sentence) > MAX_ERROR_CHARS:
        # at a word's end: a file or node name cut in two reads as another name
        cut = sentence[: MAX_ERROR_CHARS - 1]
        if " " in cut:
            cut = cut[: cut.rindex(" ")]
        sentence = cut.rstrip(" ,;:") + "…"
    return sentence


def status_text(job: JobView) -> str:
    """The status message for a job, edited in place as the job moves."""
    if job.status == "queued":
        if job.position is not None and job.position <= 0:
            parts = ["Starting…"]
        else:
            parts = [f"Queued #{job.position}" if job.position is not None else "Queued"]
        if job.eta_s is not None:
            parts.append(f"about {duration(max(job.eta_s, 1))}")
        return _esc(DOT.join(parts))
    if job.status == "running":
        parts = [f"Running on {job.backend}" if job.backend else "Running"]
        if job.progress is not None:
            parts.append(f"{round(min(max(job.progress, 0.0), 1.0) * 100)}%")
        if job.step is not None and job.steps:
            parts.append(f"step {job.step}/{job.steps}")
        if job.running_s is not None:
            parts.append(clock(job.running_s))
        return _esc(DOT.join(parts))
    if job.status == "succeeded":
        return caption(job)
    if job.status == "failed":
        return _esc(plain_error(job.error))
    return "Cancelled."


WAITED = "waited {time}"
RAN = "ran {time}"
ASKED_BY = "for {name}"
WAIT_SHOWN_FROM = 1.0  # seconds of waiting worth mentioning in a caption


def caption(
    job: JobView, *, prompt: str | None = None, asked_by: str | None = None
) -> str:
    """The caption under a result: command, seed, time (waiting and running apart when it
    waited), who asked (groups), and on a line of its own the prompt, shortened so the
    whole fits Telegram's 1024 characters."""
    parts = [f"/{job.command}"]
    if job.seed is not None:
        parts.append(f"seed {job.seed}")
    if job.waited_s is not None and job.waited_s >= WAIT_SHOWN_FROM:
        parts.append(WAITED.format(time=duration(job.waited_s)))
        if job.elapsed_s is not None:
            parts.append(RAN.format(time=duration(job.elapsed_s)))
    elif job.elapsed_s is not None:
        parts.append(duration(job.elapsed_s))
    if asked_by:
        parts.append(ASKED_BY.format(name=asked_by))
    head = DOT.join(parts)
    text = " ".join((prompt or "").split())
    if not text:
        return _fit(_esc(head), MAX_CAPTION_CHARS)
    # Telegram counts the caption's visible text in UTF-16 units: the markup is free.
    room = MAX_CAPTION_CHARS - _utf16(head) - 1
    return f"{_esc(head)}\n<i>{_esc(shorten(text, room))}</i>" if room > 8 else _fit(
        _esc(head), MAX_CAPTION_CHARS)


def _utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def shorten(text: str, limit: int) -> str:
    """`text` within `limit` UTF-16 units, cut at a word's end with "…" when too long."""
    if _utf16(text) <= limit:
        return text
    used, end = 0, 0
    for end, char in enumerate(text):  # noqa: B007 - `end` is read after the loop
        used += _utf16(char)
        if used > limit - 1:
            break
    cut = text[:end]
    if " " in cut.strip():
        cut = cut[: cut.rstrip().rindex(" ")]
    return cut.rstrip(" ,;:") + "…"


def _option_line(option: OptionHelp) -> str:
    bounds = ""
    if option.minimum is not None and option.maximum is not None:
        bounds = f" ({_num(option.minimum)}–{_num(option.maximum)})"
    elif option.minimum is not None:
        bounds = f" (at least {_num(option.minimum)})"
    elif option.maximum is not None:
        bounds = f" (at most {_num(option.maximum)})"
    default = f", default {_num(option.default)}" if option.default not in (None, "") else ""
    return f"  <code>--{_esc(option.name)}</code> {_esc(option.description)}{_esc(bounds)}" + (
        _esc(default)
    )


def _command_block(command: CommandHelp) -> str:
    lines = [f"<b>/{_esc(command.name)}</b> {_esc(command.title)}"]
    if command.description:
        lines.append(_esc(command.description))
    if command.takes_image:
        lines.append("Send it as a photo caption or as a reply to a photo.")
    lines.extend(_option_line(option) for option in command.options)
    return "\n".join(lines)


HELP_FOOTER = (
    "Options go after the prompt: <code>/{example} a fox in snow --seed 42 --ar 16:9</code>.\n"
    "<code>--no blurry, text</code> is the negative prompt, <code>--ar 16:9</code> the "
    "aspect ratio, <code>--file</code> sends the full-quality file.\n"
    "/status your jobs · /cancel stop one · /again re-roll · /history · /settings"
)
HELP_FOOTER_SHORT = HELP_FOOTER.split("\n")[-1]


def help_text(
    commands: Sequence[CommandHelp],
    unavailable: Sequence[CommandHelp] = (),
    *,
    unavailable_mark: str = "not available right now",
) -> str:
    """The /help message: every command with its options, within one message; the
    `unavailable` ones (no GPU can run them now) by name only, marked as such."""
    header = "<b>What I can do</b>"
    if not commands and not unavailable:
        return f"{header}\nNo commands are enabled right now."
    example = next((c.name for c in commands if not c.takes_image), None)
    footer = HELP_FOOTER.format(example=_esc(example)) if example else HELP_FOOTER_SHORT
    blocks: list[str] = []
    budget = MAX_MESSAGE_CHARS - len(header) - len(footer) - 80
    marked = [f"<b>/{_esc(c.name)}</b> {_esc(c.title)} · {_esc(unavailable_mark)}"
              for c in unavailable]
    budget -= sum(len(m) + 1 for m in marked)
    for index, command in enumerate(commands):
        block = _command_block(command)
        if sum(len(b) + 2 for b in blocks) + len(block) > budget:
            blocks.append(_esc(_whole_words("Also: ", [f"/{c.name}" for c in commands[index:]])))
            break
        blocks.append(block)
    if marked:
        blocks.append("\n".join(marked))
    return "\n\n".join([header, *blocks, footer])


def _whole_words(head: str, names: Sequence[str], limit: int = 70) -> str:
    """`head` and as many whole `names` as fit in `limit` characters, then "…"."""
    text = head
    for i, name in enumerate(names):
        piece = ("" if i == 0 else ", ") + name
        if len(text) + len(piece) > limit - 2:
            return text + ", …" if i else text + "…"
        text += piece
    return text


_STATUS_WORDS = {
    "queued": "queued",
    "running": "running",
    "succeeded": "done",
    "failed": "failed",
    "cancelled": "cancelled",
}


def history_text(entries: Sequence[HistoryEntry], *, prompt_chars: int = 60) -> str:
    """The /history message, newest first as given, trimmed to one message."""
    if not entries:
        return "You have no jobs yet."
    lines = ["<b>Your last jobs</b>"]
    used = len(lines[0])
    for entry in entries:
        prompt = " ".join(entry.prompt.split())
        if len(prompt) > prompt_chars:
            prompt = prompt[: prompt_chars - 1].rstrip() + "…"
        details = [entry.created_at.strftime("%d %b %H:%M"), _STATUS_WORDS[entry.status]]
        if entry.seed is not None:
            details.append(f"seed {entry.seed}")
        if entry.elapsed_s is not None:
            details.append(duration(entry.elapsed_s))
        line = (
            f"<code>#{short_id(entry.id)}</code> /{_esc(entry.command)} {_esc(prompt)}\n"
            f"  {_esc(DOT.join(details))}"
        )
        if used + len(line) + 1 > MAX_MESSAGE_CHARS:
            break
        lines.append(line)
        used += len(line) + 1
    return "\n".join(lines)


def _esc(text: str) -> str:
    return html.escape(text, quote=False)


def _num(value: float | str | None) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _fit(text: str, limit: int) -> str:
    """Cut escaped text to ``limit`` without splitting an HTML entity such as ``&amp;``."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    amp = cut.rfind("&")
    if amp >= 0 and ";" not in cut[amp:]:
        cut = cut[:amp]
    return cut + "…"
