"""What a user reads about a failed job (in the chat or on the web): one plain sentence,
never ComfyUI's words.

The worker keeps the backend's own account of a failure in the job (``jobs.error``: node,
exception, backend), which is what an operator needs and what a user must not see
("Node 2 (SaveImage) failed on backend gpu0: **** ERROR: ..."). Here it becomes one
sentence of ours; admins get the account after it. Errors written for users already
(the limits) pass through as they are, in the reader's language where the catalog has them;
"no GPU came back online within N min" is read back to say N in the reader's language.
"""

from __future__ import annotations

import re

from comfyveil import i18n
from comfyveil.i18n import N_, _, n_

MAX_ERROR_CHARS = 300

_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*File \"", re.MULTILINE)

# Translated where they are sent, in the reader's language.
INTERNAL = N_("Something went wrong on our side; please try again.")
# PostgreSQL stopped or restarting: every front end says so (503), not a server error.
DATABASE_DOWN = N_("The bot's database is not answering right now; try again in a minute.")

# What users read, in one place (to be translated as a whole).
OUT_OF_MEMORY = N_(
    "The job failed: the GPU ran out of memory; try a smaller size or fewer steps.")
WORKFLOW_FAILED = N_("The workflow failed on the GPU; please try again later.")
MISSING = N_("No GPU has what this command needs right now; please try again later.")
REFUSED = N_("The GPU refused this job's settings.")
LOST = N_("The GPU went away while running the job; please try again.")
IMAGE_LOST = N_("The GPU lost the input image; please send it again.")
TOO_LONG = N_("The job took too long on the GPU and was stopped.")
DETAIL = N_("{sentence} Detail: {detail}")
NO_RERUN = N_(
    "This job cannot run again with a new seed: its workflow has no seed, or no GPU "
    "has what it needs."
)
# The worker's AllGpusOffline text: "no GPU came back online within 5 min, so ..."
_OFFLINE = re.compile(r"^no GPU came back online within (\d+) (s|min)\b")


def _offline(match: re.Match[str]) -> str:
    n = int(match.group(1))
    if match.group(2) == "s":
        return n_(
            "No GPU came back online within {n} second, so the job was dropped; "
            "send the command again later.",
            "No GPU came back online within {n} seconds, so the job was dropped; "
            "send the command again later.",
            n,
        ).format(n=n)
    return n_(
        "No GPU came back online within {n} minute, so the job was dropped; "
        "send the command again later.",
        "No GPU came back online within {n} minutes, so the job was dropped; "
        "send the command again later.",
        n,
    ).format(n=n)

_MISSING_RULE = re.compile(r"is not installed on backend|^no GPU has the|^no GPU can run")
# (pattern over the worker's error text, the sentence users get), first match wins
_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"out of memory|OutOfMemory", re.IGNORECASE), OUT_OF_MEMORY),
    (re.compile(r"input image .* is missing on backend"), IMAGE_LOST),
    (_MISSING_RULE, MISSING),
    (re.compile(r"took longer than .* on backend"), TOO_LONG),
    (re.compile(r"failed on backend "), WORKFLOW_FAILED),
    (re.compile(r"rejected the workflow|^[^;]*\(node \w+, [^)]*\)"), REFUSED),
    (
        re.compile(
            r"cannot be reached|no longer knows the job|not understood|"
            r"interrupted on backend|on backend \S+"
        ),
        LOST,
    ),
)


def rerun_offered(params: dict[str, object], status: str, error: str | None) -> bool:
    """Whether "run again with a new seed" is worth offering for a job: its workflow has a
    seed (without one the run would repeat itself) and it did not fail because no GPU has
    what it needs (it would fail the same way). Status is the job's status word."""
    if "seed" not in params:
        return False
    return not (status == "failed" and _MISSING_RULE.search((error or "").strip()))


def sentence(error: str | None, *, detail: bool = False) -> str:
    """The sentence for a job that failed with `error` (plain text, not escaped);
    `detail`: add the worker's account (for admins)."""
    text = (error or "").strip()
    offline = _OFFLINE.match(text)
    if offline:
        return _offline(offline)
    for pattern, plain in _RULES:
        if pattern.search(text):
            if detail:
                return _(DETAIL).format(sentence=_(plain), detail=plain_error(text))
            return _(plain)
    return plain_sentence(text or _("The job failed."))


def plain_error(error: str | None) -> str:
    """One sentence from an error text: never a traceback, never a wall of text."""
    text = (error or "").strip()
    if not text or _TRACEBACK.search(text):
        return _("The job failed.")
    # Sentences the worker stored in English are in the catalog: said in the reader's
    # language; any other text (a backend's own words) stays as it is.
    first_line = " ".join(text.splitlines()[0].split())
    sentence = _(first_line)
    if len(sentence) > MAX_ERROR_CHARS:
        # at a word's end: a file or node name cut in two reads as another name
        cut = sentence[: MAX_ERROR_CHARS - 1]
        if " " in cut:
            cut = cut[: cut.rindex(" ")]
        sentence = cut.rstrip(" ,;:") + "…"
    return sentence


def plain_sentence(text: str | None) -> str:
    """One plain sentence: capitalised, ending with a full stop, no traceback."""
    plain = plain_error(text)
    if not plain:
        return _(INTERNAL)
    plain = plain[0].upper() + plain[1:]
    if plain.endswith((".", "!", "?", "…", "。", "！", "？", "؟")):
        return plain
    return plain + i18n.full_stop()
