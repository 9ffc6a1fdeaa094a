"""A job as the command line prints it: one line about where it stands, in the words
every front end shares (desk/state.py). Its own module so that `comfyveil jobs` does not
import what queueing a job needs (the desk's submission path, the delivery sinks)."""

from __future__ import annotations

from comfyveil.desk import state as job_state
from comfyveil.desk import words as desk_words
from comfyveil.i18n import _
from comfyveil.store import jobs

CLI_USER_ID = 0  # jobs queued from the command line belong to this pseudo-user


def describe_progress(job: jobs.Job, seen: job_state.JobState) -> str:
    """One line about where a job stands, for a terminal: the state every front end
    names the same way (desk/state.py), and what goes with it."""
    stage = job_state.Stage
    if seen.stage is stage.QUEUED:
        if seen.note:
            return f"{seen.word}: {seen.note}"
        if job.attempts and job.error:
            return f"{seen.word}, retrying after: {job.error}"
        if desk_words.next_in_line(seen.place):
            return f"{seen.word}, {_(desk_words.NEXT_IN_LINE)}"
        return seen.word if seen.place is None else f"{seen.word} #{seen.place}"
    if seen.stage is stage.WAITING_GPU:
        where = f" {seen.backend}" if seen.backend else ""
        there = f", #{seen.gpu_place} there" if seen.gpu_place else ""
        return f"{seen.word}{where}{there}"
    if seen.stage is stage.RUNNING:
        parts = [f"{seen.word} on {seen.backend}" if seen.backend else seen.word]
        if seen.step is not None and seen.steps:
            percent = f" ({seen.percent:.0f}%)" if seen.percent is not None else ""
            parts.append(f"step {seen.step}/{seen.steps}{percent}")
        line = ": ".join(parts)
        return line if seen.running_s is None else f"{line}, {seen.running_s:.0f} s"
    return seen.word
