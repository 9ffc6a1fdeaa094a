"""Which workflow commands some GPU can run now, as far as the backend pool knows.

The bot offers only those: in /start's example, the photo hint, the command menu and the
/help list; the others are marked "not available right now" in /help, and a user who
types one anyway gets one plain sentence instead of a job that can only fail. Users hear
*that* a model is missing, never its file name: file names are for admins (/workflows).

A command counts as runnable when one backend whose nodes and models are known has all
it needs, up or down at this moment (a backend that is down comes back, and its jobs wait
for it). Without a pool in this process, or before any backend was read, everything is
offered: the worker still refuses what no GPU can run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from comfyveil import errors
from comfyveil.comfy import workflow
from comfyveil.i18n import N_, _, ltr

if TYPE_CHECKING:
    from comfyveil.comfy import pool as pool_mod
    from comfyveil.desk import registry

# What users read; kept together so they can be translated as a whole.
NO_MODEL = N_("no GPU has its model")
NO_NODES = N_("no GPU has the nodes it needs")
NO_GPU = N_("no GPU can run it")
NOT_AVAILABLE = N_("{command} is not available right now: {reason}.")
UNAVAILABLE_MARK = N_("not available right now")

_MISSING = re.compile(r"^(model file|node type) (?P<what>.+?)(?: \([^)]*\))? is not installed$")


def _known(pool: pool_mod.Pool | None) -> list[pool_mod.Backend]:
    if pool is None:
        return []
    return [b for b in pool.backends.values() if b.object_info is not None]


def reason(pool: pool_mod.Pool | None, wf: workflow.Workflow) -> str | None:
    """Why no GPU can run `wf` now, in words for users; None when one can (or we can't
    tell)."""
    known = _known(pool)
    if not known or any(not b.problems(wf) for b in known):
        return None
    problems = [p for b in known for p in b.problems(wf)]
    if any(p.startswith("model file") for p in problems):
        return NO_MODEL
    if any(p.startswith("node type") for p in problems):
        return NO_NODES
    return NO_GPU


def missing(pool: pool_mod.Pool | None, wf: workflow.Workflow) -> list[str]:
    """What every known backend lacks to run `wf` (whole file and node names), for admins."""
    known = _known(pool)
    if not known or any(not b.problems(wf) for b in known):
        return []
    common = [p for p in known[0].problems(wf) if all(p in b.problems(wf) for b in known[1:])]
    names = []
    for problem in common or known[0].problems(wf):
        found = _MISSING.match(problem)
        names.append(found["what"] if found else problem)
    return names


def runnable(pool: pool_mod.Pool | None, entries: Sequence[registry.Entry]) -> list[registry.Entry]:
    """The entries some GPU can run now, in the given order."""
    return [e for e in entries if reason(pool, e.workflow) is None]


def edits(pool: pool_mod.Pool | None, entries: Sequence[registry.Entry]) -> list[registry.Entry]:
    """The commands that edit an image some GPU can run now (the photo hint, "Edit this
    with"), those that take words first: an edit without words (/invert) is one too."""
    found = [e for e in runnable(pool, entries) if e.takes_image]
    return sorted(found, key=lambda e: e.workflow.prompt_param is None)


def refusal(entry: registry.Entry, why: str) -> str:
    """The sentence for a user who typed a command no GPU can run now."""
    return _(NOT_AVAILABLE).format(command=ltr(f"/{entry.name}"), reason=_(why))


def check(pool: pool_mod.Pool | None, entry: registry.Entry) -> None:
    """Refuse a job of `entry` when no GPU can run it now: every front end asks this
    before queueing, so none queues a job that can only fail.

    Raises:
        UsageError: the sentence of `refusal`.
    """
    why = reason(pool, entry.workflow)
    if why is not None:
        raise errors.UsageError(refusal(entry, why))


async def confirm(pool: pool_mod.Pool | None, entry: registry.Entry) -> None:
    """`check`, after reading the lists of the backends again when they would refuse the
    job and were read more than a few seconds ago: a model installed since the last read
    counts at once.

    Raises:
        UsageError: the sentence of `refusal`.
    """
    if pool is not None and reason(pool, entry.workflow) is not None:
        await pool.refresh_models()  # those read more than a few seconds ago
    check(pool, entry)
