"""The web form's "or use one of my results" list."""

from __future__ import annotations

import datetime as dt
import uuid
from types import SimpleNamespace

from comfyveil.web import pages


async def test_two_results_of_one_prompt_in_one_second_read_differently() -> None:
    """Both read "/f of 2026-12-06 10:00:00, result 1: a fox" and could not be told
    apart: each now carries its job's short id, as the history shows it."""
    when = dt.datetime(2026, 12, 6, 10, 0, 0, tzinfo=dt.UTC)
    ids = [uuid.uuid4(), uuid.uuid4()]
    items = [
        SimpleNamespace(
            job_id=job_id, index=0, mime="image/png", command="f", created_at=when, prompt="a fox"
        )
        for job_id in ids
    ]

    async def gallery(user_id: int, *, limit: int, offset: int) -> list[SimpleNamespace]:
        return items

    svc = SimpleNamespace(web=SimpleNamespace(gallery=gallery))
    choices = await pages.result_choices(svc, SimpleNamespace(user_id=5))  # type: ignore[arg-type]
    labels = [label for _, label in choices]
    assert len(set(labels)) == 2, labels
    for job_id, label in zip(ids, labels, strict=True):
        assert f"#{job_id.hex[:8]}" in label and label.endswith(": a fox")
