"""Errors raised by duejobs.

Everything a caller can get wrong is a ``ValueError`` subclass (:class:`InvalidScheduleError`)
whose message names the problem; when one is raised, nothing has been written. Conditions of
the running system (a schedule that is gone, a version that moved, a database that is down)
have their own classes so callers can tell them apart.
"""

from __future__ import annotations

import re


class DuejobsError(Exception):
    """Base class of every error duejobs raises on purpose."""


class ConfigurationError(DuejobsError):
    """duejobs cannot find or reach what it was configured with."""


class DriverMissingError(ConfigurationError, ImportError):
    """psycopg cannot be imported: not installed, or installed without a libpq to load (the
    plain ``psycopg`` requirement brings none). The message says how to get one."""

    @classmethod
    def from_import(cls, error: ImportError) -> DriverMissingError:
        said = str(error).splitlines()[0] if str(error) else type(error).__name__
        return cls(
            f"duejobs cannot load psycopg ({said}): install psycopg with its own libpq, "
            '`pip install "duejobs[binary]"`, or give it the system\'s libpq '
            "(Debian and Ubuntu: `apt install libpq5`; or build psycopg[c])"
        )


class SchemaMissingError(ConfigurationError):
    """duejobs' tables do not exist in this database yet: run ``duejobs migrate``."""


class PartitioningError(ConfigurationError):
    """Partitioned mode asked for where it cannot be set up as asked (tables holding rows,
    settings out of range)."""


class InvalidScheduleError(DuejobsError, ValueError):
    """A schedule request was refused before anything was written."""


class InvalidCronError(InvalidScheduleError):
    """The cron expression cannot be parsed, or is one the scheduler would read differently."""


class EmptyTypeError(InvalidScheduleError):
    """The job type is empty, not a string, or too long."""


class UnknownTypeError(InvalidScheduleError):
    """No handler is registered for the type in an App that knows its handlers (a typo), and
    the App was not made with ``strict_types=False``."""


class InvalidTenantError(InvalidScheduleError):
    """The tenant name is empty or has characters outside ``[A-Za-z0-9_.-]``."""


class InvalidQueueError(InvalidScheduleError):
    """A queue name that is not ``[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}``."""


class InvalidPriorityError(InvalidScheduleError):
    """A priority that is not an integer from -100 to 100."""


class InvalidRateError(InvalidScheduleError):
    """A rate limit that is not ``"N/s"``, ``"N/m"`` or ``"N/h"`` with a whole N >= 1."""


class InvalidKeyError(InvalidScheduleError):
    """The business key is empty, not a string, or too long."""


class TimeSpecError(InvalidScheduleError):
    """Both or neither of ``delay`` / ``run_at`` were given, or one has the wrong type."""


class NegativeDelayError(InvalidScheduleError):
    """The delay is negative (or not a finite number)."""


class NaiveDatetimeError(InvalidScheduleError):
    """A naive ``run_at`` was given without a ``timezone`` to read it in."""


class UnknownTimezoneError(InvalidScheduleError):
    """The time zone is not a known IANA name such as ``America/Sao_Paulo``."""


class PayloadNotJSONError(InvalidScheduleError):
    """The payload cannot be stored as JSON (sets, datetimes, NaN, ...)."""


class PayloadTooLargeError(InvalidScheduleError):
    """The JSON payload exceeds the configured limit; store ids, not copies."""


class InvalidScheduleIdError(InvalidScheduleError):
    """The schedule id is not a UUID."""


class InvalidListError(InvalidScheduleError):
    """A list's filter, limit or cursor was refused (:meth:`duejobs.App.list`)."""


class InvalidHandlerError(DuejobsError, ValueError):
    """A handler registration has an invalid option (attempts, backoff, timeout)."""


class TenantMismatchError(InvalidScheduleError):
    """A tenant-scoped App was asked to write for another tenant."""


class QuotaExceededError(DuejobsError):
    """The tenant already has as many live schedules as its quota allows; nothing written."""

    def __init__(self, tenant: str, cap: int) -> None:
        super().__init__(f"tenant {tenant!r} has reached its quota of {cap} live schedules")
        self.tenant = tenant
        self.cap = cap


class ScheduleNotFoundError(DuejobsError, LookupError):
    """No schedule with that id is visible to this App (missing or another tenant's)."""


class ScheduleNotLiveError(DuejobsError):
    """The schedule already finished or was cancelled, so it cannot be rescheduled."""


class VersionConflictError(DuejobsError):
    """``expected_version`` no longer matches: someone else changed the schedule first."""

    def __init__(self, schedule_id: object, expected: int, actual: int) -> None:
        super().__init__(
            f"schedule {schedule_id} is at version {actual}, not the expected {expected}"
        )
        self.expected = expected
        self.actual = actual


class ScheduleNotRetryableError(DuejobsError):
    """Only a ``failed`` or ``cancelled`` schedule can be retried."""


class KeyInUseError(DuejobsError):
    """The schedule's key is held by another live schedule (keys are unique among live ones)."""


class DatabaseUnavailableError(DuejobsError):
    """PostgreSQL could not be reached or dropped the connection; nothing was committed."""


class ReadTimeoutError(DuejobsError):
    """An operator's read (a list, the figures) ran past its time limit (``read_timeout``)
    and was stopped; nothing was changed."""


class ScheduleChangedError(DuejobsError):
    """The schedule was cancelled, rescheduled or rescued while this attempt ran.

    Raised by ``ctx.ensure_current()`` and ``ctx.transaction()`` so a handler stops before its
    external effect; the worker records the attempt as stale instead of retrying it.
    """

    def __init__(self, schedule_id: object, reason: str) -> None:
        super().__init__(f"schedule {schedule_id} changed while running: {reason}")
        self.reason = reason


class EffectAlreadyAppliedError(DuejobsError):
    """The effect key is already in the ledger: this effect happened once and won't again."""


class Permanent(Exception):
    """Raised by a handler: this attempt failed and no retry can help (a refused card, a
    record that no longer exists). The schedule fails at once, with this error as its
    ``last_error``, whatever attempts its policy has left."""


class HandlerTimeoutError(BaseException):
    """The handler ran past its type's timeout; the attempt counts as failed.

    A ``BaseException``, like ``KeyboardInterrupt``, so that a handler's own ``except
    Exception`` (a retry loop, say) cannot swallow it; it is raised again every second until
    the handler returns, and a handler that still does not return is ended with its worker
    (see :mod:`duejobs.worker`).
    """


def describe(exc: BaseException) -> str:
    """An error as duejobs stores it (``last_error``): its type and message, as text
    PostgreSQL can hold (no NUL, no lone surrogate), at most 2,000 characters; a placeholder
    for a message whose ``str()`` raises, so that the attempt is closed all the same."""
    try:
        message = str(exc)
    except Exception as broken:  # a handler's exception whose text cannot be made
        message = f"<its str() raised {type(broken).__name__}>"
    text = f"{type(exc).__name__}: {message}"[:2000].replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def outage(exc: BaseException) -> str | None:
    """One line naming the service behind an outage error (``PostgreSQL is unavailable:
    ...``), or None for an error that is no outage. Driver messages carry no password."""
    from redis.exceptions import RedisClusterException, RedisError
    from sqlalchemy.exc import InterfaceError, OperationalError

    # Both of redis-py's families (duejobs.redis_urls.redis_failures, which imports this).
    if isinstance(exc, RedisError | RedisClusterException):
        said = f"Redis is unavailable: {redis_said(exc)}"
    elif isinstance(exc, (OperationalError, InterfaceError)):
        said = f"PostgreSQL is unavailable: {exc.orig}"
    elif isinstance(exc, (DatabaseUnavailableError, SchemaMissingError, ReadTimeoutError)):
        said = str(exc)
    else:
        return None
    return " ".join(said.split())


# How redis-py shows a Sentinel client in its "no master found" (each Sentinel's answer
# after it): the client's repr, in its older form and its newer, a line of options long.
_SENTINEL_CLIENT = re.compile(
    r"(?:<redis\.client\.Redis\(.*?\)>\)>\)>|Redis<ConnectionPool<.*?>>>) - "
)


def redis_said(exc: BaseException) -> str:
    """A Redis error in one line for a log: Sentinel's "no master found" keeps what each
    Sentinel answered, without the redis-py client it names each by."""
    return _SENTINEL_CLIENT.sub("", str(exc))
