"""A bound on the requests of one account answered at once by this process, each one
holding an answer slot from its first check to its last byte."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Awaitable, Callable

from aiohttp import web

from comfyveil.api.context import ACCOUNT
from comfyveil.api.errors import QUEUE_RETRY_SECONDS, ApiError
from comfyveil.i18n import _

# Requests of one account answered at once: each may hold up to MAX_N jobs' outputs in
# memory as base64, and a retry with the same Idempotency-Key costs no quota, so without
# this bound one account could have any number of answers built at once.
MAX_ANSWERING = 4
_answering: Counter[int] = Counter()
_SLOT = web.RequestKey("api_answering", int)


def answering(account_id: int) -> int:
    """How many requests of this account are being answered now (in this process)."""
    return _answering[account_id]


def enter(request: web.Request) -> None:
    """Take one of the account's answer slots, or refuse with 429."""
    account_id = request[ACCOUNT].id
    if _answering[account_id] >= MAX_ANSWERING:
        raise ApiError(
            429,
            _("This account has {n} requests being answered; send more when one has ended.").format(
                n=MAX_ANSWERING
            ),
            code="rate_limit_exceeded",
            retry_after=QUEUE_RETRY_SECONDS,
        )
    _answering[account_id] += 1
    request[_SLOT] = account_id


def one_of_few(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """`handler`, giving back the answer slot `enter` took, however it ends."""

    @functools.wraps(handler)
    async def bounded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        finally:
            account_id = request.get(_SLOT)
            if account_id is not None:
                _answering[account_id] -= 1
                if _answering[account_id] <= 0:
                    del _answering[account_id]

    return bounded
