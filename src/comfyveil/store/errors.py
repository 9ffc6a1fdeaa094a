"""Errors of the PostgreSQL store.

    StoreError
     ├── DatabaseUnreachable      no connection to PostgreSQL (down, wrong URL, pool timeout)
     ├── EmbeddedServerError      the embedded PostgreSQL (pgserver) did not start
     ├── MigrationError           a schema migration failed or the schema is newer than the code
     ├── JobNotFound              no job with that id
     ├── LeaseLost                the worker no longer holds the job's lease
     ├── QueueLimitReached        (also a UsageError) too many jobs waiting for one user
     ├── DailyQuotaReached        (also a UsageError) the user's jobs for today are used up
     └── CoolingDown              (also a UsageError) the user's last job was too recent

psycopg and psycopg_pool errors are translated once, in `wrap_exceptions`; nothing
else in comfyveil needs to know about psycopg's exception classes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import psycopg_pool

from comfyveil import i18n
from comfyveil.errors import ComfyveilError, UsageError

logger = logging.getLogger(__name__)


class StoreError(ComfyveilError):
    """The database could not complete the request."""


class DatabaseUnreachable(StoreError):
    """The database is unreachable."""


class EmbeddedServerError(StoreError):
    """The embedded PostgreSQL server could not be started."""


class MigrationError(StoreError):
    """The database schema could not be brought up to date."""


class JobNotFound(StoreError):
    """There is no such job."""


class LeaseLost(StoreError):
    """This worker no longer holds the job; another worker may have taken it over."""


class CancelRequested(StoreError):
    """The job's cancel was asked for before its prompt was sent: it must not be sent."""


class QueueLimitReached(StoreError, UsageError):
    """You already have too many jobs waiting; wait for one to finish."""

    def __init__(self, limit: int, message: str | None = None) -> None:
        self.limit = limit
        super().__init__(message or i18n.ngettext(
            "you already have {n} job waiting or running; wait for it to finish or cancel it",
            "you already have {n} jobs waiting or running; wait for one to finish or cancel one",
            limit,
        ).format(n=i18n.ltr(limit)))


QUOTA_RESETS = "00:00 UTC"  # when daily quotas start again


class DailyQuotaReached(StoreError, UsageError):
    """You have used all your jobs for today."""

    def __init__(self, quota: int, message: str | None = None) -> None:
        self.quota = quota
        # The day is UTC's (user_usage.day): "tomorrow" alone is wrong for half the world.
        super().__init__(message or i18n.ngettext(
            "you have used the {n} job of your daily quota; try again after {time}",
            "you have used all {n} jobs of your daily quota; try again after {time}",
            quota,
        ).format(n=i18n.ltr(quota), time=i18n.ltr(QUOTA_RESETS)))


class CoolingDown(StoreError, UsageError):
    """Wait a moment before your next job."""

    def __init__(self, seconds: int, message: str | None = None) -> None:
        self.seconds = seconds
        super().__init__(message or i18n.ngettext(
            "wait {n} second before your next job", "wait {n} seconds before your next job",
            seconds,
        ).format(n=i18n.ltr(seconds)))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def translate(exc: BaseException) -> StoreError:
    """The StoreError that says in plain words what a psycopg error means."""
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return DatabaseUnreachable(
            "the database is unreachable: no connection became available in time"
        )
    if isinstance(exc, psycopg.OperationalError) and not isinstance(
        exc, psycopg.errors.QueryCanceled
    ):
        return DatabaseUnreachable(f"the database is unreachable: {_first_line(exc)}")
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return StoreError("the database took too long to answer")
    if isinstance(exc, psycopg.Error):
        # Its text may quote the values refused (invalid input syntax for ...: "...",
        # CONTEXT: JSON data ...): a prompt. Its SQLSTATE says enough (issue 22 §8).
        return StoreError(f"the database refused the request (SQLSTATE {exc.sqlstate or '?'})")
    return StoreError(f"the database could not complete the request: {_first_line(exc)}")


@asynccontextmanager
async def wrap_exceptions() -> AsyncIterator[None]:
    """Turn psycopg errors raised inside the block into StoreError subclasses."""
    try:
        yield
    except StoreError:
        raise
    except (psycopg.Error, psycopg_pool.PoolTimeout, OSError) as exc:
        raise translate(exc) from exc
