"""Turn job state into the text users see in chat (pure).

Every function returns Telegram HTML (send with ``parse_mode="HTML"``): user-supplied and
stored text is escaped, and the result fits Telegram's limits (4096 characters for a
message, 1024 for a caption, counted after HTML parsing; we count the markup too, which
only errs on the safe side). Inputs are small frozen dataclasses defined here, so the bot
can map store rows onto them without this module knowing the store.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from comfyveil import i18n
from comfyveil.desk import words as desk_words
from comfyveil.desk.failures import MAX_ERROR_CHARS as MAX_ERROR_CHARS
from comfyveil.desk.failures import plain_error as plain_error
from comfyveil.desk.registry import CommandHelp as CommandHelp
from comfyveil.desk.registry import OptionHelp as OptionHelp
from comfyveil.desk.words import STATUS_WORDS
from comfyveil.i18n import N_, _, ltr

MAX_MESSAGE_CHARS = 4096
MAX_CAPTION_CHARS = 1024
SHORT_ID_CHARS = 8
DOT = " · "

JobStatus = Literal["queued", "waiting", "running", "succeeded", "failed", "cancelled"]

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
        return _("{seconds} s").format(seconds=f"{seconds:.1f}")
    if seconds < 90:
        return _("{seconds} s").format(seconds=round(seconds))
    minutes = round(seconds / 60)
    if minutes < 60:
        return _("{minutes} min").format(minutes=minutes)
    hours, minutes = divmod(minutes, 60)
    if minutes:
        return _("{hours} h {minutes} min").format(hours=hours, minutes=minutes)
    return _("{hours} h").format(hours=hours)


def clock(seconds: float) -> str:
    """Elapsed time in whole seconds, as a status shows it: ``7 s``, ``2 min 05 s``."""
    whole = max(0, int(seconds))
    if whole < 60:
        return _("{seconds} s").format(seconds=whole)
    minutes, rest = divmod(whole, 60)
    return _("{minutes} min {seconds} s").format(minutes=minutes, seconds=f"{rest:02d}")


def status_text(job: JobView) -> str:
    """The status message for a job, edited in place as the job moves."""
    if job.status == "queued":
        if job.position is not None and job.position <= 0:
            parts = [_("Starting…")]
        elif desk_words.next_in_line(job.position):
            parts = [_("Queued"), _(desk_words.NEXT_IN_LINE)]
        elif job.position is not None:
            parts = [_("Queued {position}").format(position=ltr(f"#{job.position}"))]
        else:
            parts = [_("Queued")]
        if job.eta_s is not None:
            parts.append(_("about {time}").format(time=ltr(duration(max(job.eta_s, 1)))))
        return _esc(DOT.join(parts))
    if job.status == "running":
        parts = [_("Running on {backend}").format(backend=ltr(job.backend)) if job.backend
                 else _("Running")]
        if job.progress is not None:
            percent = round(min(max(job.progress, 0.0), 1.0) * 100)
            parts.append(ltr(_("{percent}%").format(percent=percent)))
        if job.step is not None and job.steps:
            # one isolate for both numbers: "9/20" must not turn into "20/9"
            parts.append(_("step {progress}").format(progress=ltr(f"{job.step}/{job.steps}")))
        if job.running_s is not None:
            parts.append(clock(job.running_s))
        return _esc(DOT.join(parts))
    if job.status == "succeeded":
        return caption(job)
    if job.status == "failed":
        return _esc(plain_error(job.error))
    return _("Cancelled.")


WAITED = N_("waited {time}")
RAN = N_("ran {time}")
ASKED_BY = N_("for {name}")
WAIT_SHOWN_FROM = 1.0  # seconds of waiting worth mentioning in a caption


def caption(
    job: JobView, *, prompt: str | None = None, asked_by: str | None = None
) -> str:
    """The caption under a result: command, seed, time (waiting and running apart when it
    waited), who asked (groups), and on a line of its own the prompt, shortened so the
    whole fits Telegram's 1024 characters."""
    parts = [ltr(f"/{job.command}")]
    if job.seed is not None:
        parts.append(_("seed {seed}").format(seed=ltr(job.seed)))
    if job.waited_s is not None and job.waited_s >= WAIT_SHOWN_FROM:
        parts.append(_(WAITED).format(time=ltr(duration(job.waited_s))))
        if job.elapsed_s is not None:
            parts.append(_(RAN).format(time=ltr(duration(job.elapsed_s))))
    elif job.elapsed_s is not None:
        parts.append(ltr(duration(job.elapsed_s)))
    if asked_by:
        parts.append(_(ASKED_BY).format(name=asked_by))
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
        bounds = f" ({ltr(f'{_num(option.minimum)}–{_num(option.maximum)}')})"
    elif option.minimum is not None:
        bounds = " (" + _("at least {n}").format(n=ltr(_num(option.minimum))) + ")"
    elif option.maximum is not None:
        bounds = " (" + _("at most {n}").format(n=ltr(_num(option.maximum))) + ")"
    default = ""
    if option.default not in (None, ""):
        default = ", " + _("default {value}").format(value=ltr(_num(option.default)))
    # A parameter without a description of its own is described by its name: once is enough.
    said = "" if option.description in ("", option.name) else f" {_esc(option.description)}"
    return f"  {ltr(f'<code>--{_esc(option.name)}</code>')}{said}" + (
        _esc(bounds)
    ) + (
        _esc(default)
    )


def _command_block(command: CommandHelp) -> str:
    lines = [f"<b>{ltr(f'/{_esc(command.name)}')}</b> {_esc(command.title)}"]
    if command.description:
        lines.append(_esc(command.description))
    if command.takes_image:
        lines.append(_("Send it as a photo caption or as a reply to a photo."))
    lines.extend(_option_line(option) for option in command.options)
    return "\n".join(lines)


def help_footer(example: CommandHelp | None, *, web: bool = False) -> str:
    """How options are written, then the user's own commands (Telegram HTML); `web`: the
    web front end is enabled (/web gives its link)."""
    own = _("{status} your jobs · {cancel} stop one · {again} re-roll · {history} · {settings}"
            ).format(status=ltr("/status"), cancel=ltr("/cancel"), again=ltr("/again"),
                     history=ltr("/history"), settings=ltr("/settings"))
    if web:
        own += "\n" + _("{forget} deletes all your data · {web} opens me in a browser").format(
            forget=ltr("/forget"), web=ltr("/web"))
    else:
        own += "\n" + _("{forget} deletes all your data").format(forget=ltr("/forget"))
    if example is None:
        return own
    # The example uses only options that command has: /help's own example is never refused.
    shown = f"/{_esc(example.name)} " + _esc(_("a fox in snow"))
    if any(option.name == "seed" for option in example.options):
        shown += " --seed 42"
    if example.sized:
        shown += " --ar 16:9"
    marks = {"negative": ltr("<code>" + _esc(_("--no blurry, text")) + "</code>"),
             "aspect": ltr("<code>--ar 16:9</code>"), "file": ltr("<code>--file</code>")}
    if example.negative and example.sized:
        said = _("{negative} is the negative prompt, {aspect} the aspect ratio, {file} sends "
                 "the full-quality file.")
    elif example.sized:
        said = _("{aspect} is the aspect ratio, {file} sends the full-quality file.")
    elif example.negative:
        said = _("{negative} is the negative prompt, {file} sends the full-quality file.")
    else:
        said = _("{file} sends the full-quality file.")
    lines = [
        _("Options go after the prompt: {example}.").format(example=ltr(f"<code>{shown}</code>")),
        said.format(**marks),
        own,
    ]
    return "\n".join(lines)


def help_text(
    commands: Sequence[CommandHelp],
    unavailable: Sequence[CommandHelp] = (),
    *,
    unavailable_mark: str = N_("not available right now"),
    web: bool = False,
) -> str:
    """The /help message: every command with its options, within one message; the
    `unavailable` ones (no GPU can run them now) by name only, marked as such."""
    header = _("<b>What I can do</b>")
    if not commands and not unavailable:
        return header + "\n" + _("No commands are enabled right now.")
    example = next((c for c in commands if not c.takes_image), None)
    footer = help_footer(example, web=web)
    blocks: list[str] = []
    budget = MAX_MESSAGE_CHARS - len(header) - len(footer) - 80
    marked = [f"<b>{ltr(f'/{_esc(c.name)}')}</b> {_esc(c.title)} · {_esc(_(unavailable_mark))}"
              for c in unavailable]
    budget -= sum(len(m) + 1 for m in marked)
    for index, command in enumerate(commands):
        block = _command_block(command)
        if sum(len(b) + 2 for b in blocks) + len(block) > budget:
            names = [ltr(f"/{c.name}") for c in commands[index:]]
            blocks.append(_esc(_("Also: {names}").format(names=_whole_words("", names))))
            break
        blocks.append(block)
    if marked:
        blocks.append("\n".join(marked))
    return "\n\n".join([header, *blocks, footer])


def _whole_words(head: str, names: Sequence[str], limit: int = 70) -> str:
    """`head` and as many whole `names` as fit in `limit` characters, then "…"."""
    text = head
    for i, name in enumerate(names):
        piece = ("" if i == 0 else i18n.list_separator()) + name
        if len(text) + len(piece) > limit - 2:
            return text + i18n.list_separator() + "…" if i else text + "…"
        text += piece
    return text


def history_text(entries: Sequence[HistoryEntry], *, prompt_chars: int = 60) -> str:
    """The /history message, newest first as given, trimmed to one message."""
    if not entries:
        return _("You have no jobs yet.")
    lines = [_("<b>Your last jobs</b>")]
    used = len(lines[0])
    for entry in entries:
        prompt = " ".join(entry.prompt.split())
        if len(prompt) > prompt_chars:
            prompt = prompt[: prompt_chars - 1].rstrip() + "…"
        details = [ltr(i18n.date_time(entry.created_at)), _(STATUS_WORDS[entry.status])]
        if entry.seed is not None:
            details.append(_("seed {seed}").format(seed=ltr(entry.seed)))
        if entry.elapsed_s is not None:
            details.append(ltr(duration(entry.elapsed_s)))
        line = (
            f"{ltr(f'<code>#{short_id(entry.id)}</code> /{_esc(entry.command)}')} "
            f"{_esc(prompt)}\n  {_esc(DOT.join(details))}"
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
