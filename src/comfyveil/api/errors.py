"""Errors as OpenAI's clients read them: ``{"error": {"message", "type", "param",
"code"}}`` with the status code their SDK maps to an exception class."""

from __future__ import annotations

import datetime as dt
import json

from aiohttp import web

from comfyveil import errors
from comfyveil.desk import access
from comfyveil.i18n import _
from comfyveil.store import errors as store_errors

QUEUE_RETRY_SECONDS = 30  # a guess at when one of the user's jobs will have finished


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after = retry_after

    def response(self) -> web.Response:
        body = {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }
        response = web.Response(
            text=json.dumps(body), status=self.status, content_type="application/json"
        )
        if self.retry_after is not None:
            response.headers["Retry-After"] = str(max(1, self.retry_after))
        return response


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, errors.sentence(message), param=param, code=code)


def _seconds_to_midnight() -> int:
    now = dt.datetime.now(dt.UTC)
    tomorrow = (now + dt.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return int((tomorrow - now).total_seconds()) + 1


def from_usage(exc: errors.UsageError) -> ApiError:
    """The answer to a refusal of the desk: the limits are 429 with when to come back, a
    banned user 403, anything else a bad request in the desk's own words."""
    message = errors.sentence(_(str(exc)))
    if isinstance(exc, store_errors.CoolingDown):
        return ApiError(429, message, code="rate_limit_exceeded", retry_after=exc.seconds)
    if isinstance(exc, store_errors.QueueLimitReached):
        return ApiError(429, message, code="rate_limit_exceeded", retry_after=QUEUE_RETRY_SECONDS)
    if isinstance(exc, store_errors.DailyQuotaReached):
        return ApiError(429, message, code="insufficient_quota", retry_after=_seconds_to_midnight())
    if isinstance(exc, access.NotAllowed):  # banned: the key is good, its owner may not
        return ApiError(403, message, type="permission_error", code="not_allowed")
    param = getattr(exc, "param", None)
    return ApiError(400, message, param=param if isinstance(param, str) else None)
