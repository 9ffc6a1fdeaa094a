"""The images API's pieces that need no server: signed links expire and name one output;
the desk's refusals become the status codes OpenAI's clients expect."""

from __future__ import annotations

import time
import uuid

from comfyveil.api import errors, links
from comfyveil.desk import access
from comfyveil.errors import UsageError
from comfyveil.store import errors as store_errors

SECRET = b"s" * 32


def test_a_signed_link_names_one_output_and_expires() -> None:
    job = uuid.uuid4()
    path = links.path(SECRET, job, 0)
    query = dict(p.split("=") for p in path.split("?")[1].split("&"))
    assert links.valid(SECRET, job, 0, query["expires"], query["sig"])
    assert not links.valid(SECRET, job, 1, query["expires"], query["sig"])  # another output
    assert not links.valid(SECRET, uuid.uuid4(), 0, query["expires"], query["sig"])
    assert not links.valid(b"t" * 32, job, 0, query["expires"], query["sig"])  # another site
    longer = str(int(query["expires"]) + 3600)
    assert not links.valid(SECRET, job, 0, longer, query["sig"])  # its time is signed too
    old = links.path(SECRET, job, 0, now=time.time() - links.LINK_SECONDS - 1)
    q_old = dict(p.split("=") for p in old.split("?")[1].split("&"))
    assert not links.valid(SECRET, job, 0, q_old["expires"], q_old["sig"])
    assert not links.valid(SECRET, job, 0, "soon", query["sig"])


def test_limits_are_429_with_retry_after_and_other_refusals_400() -> None:
    cooling = errors.from_usage(store_errors.CoolingDown(7))
    assert (cooling.status, cooling.retry_after) == (429, 7)
    assert cooling.response().headers["Retry-After"] == "7"
    quota = errors.from_usage(store_errors.DailyQuotaReached(5))
    assert quota.status == 429 and quota.code == "insufficient_quota"
    assert 0 < (quota.retry_after or 0) <= 86_401
    queue = errors.from_usage(store_errors.QueueLimitReached(3))
    assert queue.status == 429 and (queue.retry_after or 0) > 0
    banned = errors.from_usage(access.NotAllowed("You are not allowed to use this service."))
    assert banned.status == 403
    plain = errors.from_usage(UsageError("steps must be between 1 and 8"))
    assert plain.status == 400 and plain.message == "Steps must be between 1 and 8."
    body = plain.response().text or ""
    assert (
        '"error"' in body
        and '"param": null' in body
        and "Retry-After" not in (plain.response().headers)
    )
