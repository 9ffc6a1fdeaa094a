"""The words a user reads about a job and an account, in any front end: a job's status,
a role, where a command comes from. Kept as msgids (N_) and said in the reader's
language where they are shown."""

from __future__ import annotations

from comfyveil.i18n import N_, _

# A job's status in a word, for /history and the web pages.
STATUS_WORDS = {
    "queued": N_("queued"),
    "waiting": N_("waiting on a GPU"),  # accepted by a backend, pending in its own queue
    "running": N_("running"),
    "succeeded": N_("done"),
    "failed": N_("failed"),
    "cancelled": N_("cancelled"),
}

# The first in our queue, in every front end ("queued, next in line"): not "#1", nor "0
# jobs ahead" while every GPU is busy; nothing of ours waits before it.
NEXT_IN_LINE = N_("next in line")

ROLE_WORDS = {"user": N_("user"), "admin": N_("admin"), "banned": N_("banned")}
SOURCE_WORDS = {"shipped": N_("shipped"), "operator": N_("operator")}


def offline_wait(seconds: float) -> str:
    """How long a job waits while every GPU is offline, as the worker's own sentence says
    it when it gives up ("within 25 s", "within 30 min"): one span for users and admins."""
    if seconds < 90:
        return _("{seconds} s").format(seconds=round(seconds))
    return _("{minutes} min").format(minutes=round(seconds / 60))


def next_in_line(place: int | None) -> bool:
    """Whether a queued job's place (1: next) is said as `NEXT_IN_LINE` rather than a
    number."""
    return place is not None and place <= 1


def status_word(status: str) -> str:
    word = STATUS_WORDS.get(status)
    return _(word) if word else status


def role_word(role: str) -> str:
    return _(ROLE_WORDS[role]) if role in ROLE_WORDS else role


def source_word(source: str) -> str:
    return _(SOURCE_WORDS[source]) if source in SOURCE_WORDS else source
