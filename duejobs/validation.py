"""Checks on what callers pass in, done before anything touches the database."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from duejobs.errors import (
    ConfigurationError,
    EmptyTypeError,
    InvalidKeyError,
    InvalidListError,
    InvalidPriorityError,
    InvalidQueueError,
    InvalidScheduleError,
    InvalidTenantError,
    NaiveDatetimeError,
    PayloadNotJSONError,
    PayloadTooLargeError,
)
from duejobs.models import Status

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
DEFAULT_TENANT = "default"
MAX_TYPE_LENGTH = 200
MAX_KEY_LENGTH = 500
# Tenants appear in queue job ids and metric labels: keep them to a safe, readable alphabet.
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# Queues become Redis keys beside RQ's own (``rq:queue:<name>:intermediate``): no ``:``.
_QUEUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# Containers nested deeper than this are refused (PostgreSQL's parser and Python's encoder
# recurse on them); a payload is ids and a few fields, not a tree.
MAX_PAYLOAD_DEPTH = 64
# A NUL escaped in JSON text: ``\u0000`` after an even number of backslashes (an odd number
# means the payload merely spells it, which jsonb stores fine).
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def check_text(value: str, name: str) -> str:
    """A text PostgreSQL can store: no NUL, no lone surrogate."""
    if "\x00" in value:
        raise InvalidScheduleError(f"{name} contains a NUL character")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidScheduleError(f"{name} contains a lone surrogate") from None
    return value


def check_type(job_type: object) -> str:
    """A job type: a non-empty string without surrounding blanks."""
    if not isinstance(job_type, str) or not job_type.strip():
        raise EmptyTypeError(f"job type must be a non-empty string, got {job_type!r}")
    if job_type != job_type.strip() or len(job_type) > MAX_TYPE_LENGTH:
        raise EmptyTypeError(
            f"job type must have no surrounding blanks and at most {MAX_TYPE_LENGTH} characters"
        )
    return check_text(job_type, "job type")


def check_tenant(tenant: object) -> str:
    """A tenant name matching ``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``."""
    if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
        raise InvalidTenantError(
            f"tenant must match [A-Za-z0-9][A-Za-z0-9_.-]{{0,63}}, got {tenant!r}"
        )
    return tenant


def check_queue(queue: object) -> str:
    """An RQ queue name matching ``[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}``."""
    if not isinstance(queue, str) or not _QUEUE.fullmatch(queue):
        raise InvalidQueueError(
            f"queue must match [A-Za-z0-9][A-Za-z0-9_.-]{{0,63}} (no ':', which RQ's own keys "
            f"use), got {queue!r}"
        )
    return queue


# Priorities as django.tasks counts them: higher runs first, the default in the middle.
MIN_PRIORITY, DEFAULT_PRIORITY, MAX_PRIORITY = -100, 0, 100


def check_priority(priority: object) -> int:
    """A priority: an int from :data:`MIN_PRIORITY` to :data:`MAX_PRIORITY` (not a bool)."""
    if (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise InvalidPriorityError(
            f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY} (higher runs "
            f"first), got {priority!r}"
        )
    return priority


def check_key(key: object) -> str | None:
    """An optional business key (``None`` means no de-duplication)."""
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidKeyError(
            f"key must be a non-empty string of at most {MAX_KEY_LENGTH} characters, got {key!r}"
        )
    return check_text(key, "key")


# One encoder for every payload: json.dumps with options builds a new one on every call.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def encode_payload(payload: Any, max_bytes: int) -> str:
    """The payload as JSON text, refused when it is not JSON or larger than ``max_bytes``."""
    return payload_encoder(max_bytes)(payload)


def payload_encoder(max_bytes: int) -> Callable[[Any], str]:
    """:func:`encode_payload` for the payloads of one batch, with one C encoder for them all
    (``JSONEncoder.encode`` builds one per call: half its cost), made with the arguments
    ``JSONEncoder`` gives it, so the text and the refusals are the same.

    For one thread and one batch: the encoder's record of the containers it is inside is
    left dirty by a refused payload, which ends the batch."""
    to_json: Callable[[Any], str] = _ENCODER.encode  # a Python without json's C accelerator
    if c_make_encoder is not None:
        encoder = c_make_encoder(
            {},
            _ENCODER.default,
            encode_basestring,
            None,
            _ENCODER.key_separator,
            _ENCODER.item_separator,
            False,
            False,
            False,
        )

        def to_json(payload: Any) -> str:
            return "".join(encoder(payload, 0))

    def encode(payload: Any) -> str:
        try:
            text = to_json(payload)
        except (TypeError, ValueError) as exc:
            raise PayloadNotJSONError(f"payload is not JSON-serialisable: {exc}") from exc
        except RecursionError:
            raise PayloadNotJSONError(
                f"payload nests deeper than {MAX_PAYLOAD_DEPTH} levels"
            ) from None
        if "\\u0000" in text and _NUL.search(text):
            raise PayloadNotJSONError("payload contains a NUL character, which jsonb cannot store")
        if (
            text.count("[") + text.count("{") > MAX_PAYLOAD_DEPTH
            and _depth(text) > MAX_PAYLOAD_DEPTH
        ):
            raise PayloadNotJSONError(f"payload nests deeper than {MAX_PAYLOAD_DEPTH} levels")
        try:
            size = len(text) if text.isascii() else len(text.encode())  # isascii() reads a flag
        except UnicodeEncodeError:
            raise PayloadNotJSONError("payload contains a lone surrogate (not UTF-8)") from None
        if size > max_bytes:
            raise PayloadTooLargeError(
                f"payload is {size} bytes of JSON, over the limit of {max_bytes}: "
                "store ids and read the rest when the job runs"
            )
        return text

    return encode


def _depth(text: str) -> int:
    """How deep the containers of a JSON text nest (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


MAX_LIST_LIMIT = 1000


def check_list_limit(limit: object) -> int:
    """A page size: an int from 1 to :data:`MAX_LIST_LIMIT`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidListError(f"limit must be an int from 1 to {MAX_LIST_LIMIT}, got {limit!r}")
    return limit


def check_statuses(status: object) -> list[Status] | None:
    """The statuses a list keeps: one (a :class:`Status` or its name) or several; None: all."""
    if status is None:
        return None
    given = [status] if isinstance(status, str) else status
    if not isinstance(given, Iterable):
        raise InvalidListError(f"status must be a status or several, got {status!r}")
    statuses = []
    for one in given:
        try:
            statuses.append(Status(one))
        except ValueError:
            known = ", ".join(s.value for s in Status)
            raise InvalidListError(f"unknown status {one!r} (one of {known})") from None
    if not statuses:
        raise InvalidListError("status must name at least one status when given")
    return statuses


def check_due_range(due_from: datetime | None, due_before: datetime | None) -> None:
    """A due-time range: aware datetimes (either may be open), ``due_from`` first."""
    for name, bound in (("due_from", due_from), ("due_before", due_before)):
        if bound is None:
            continue
        if not isinstance(bound, datetime):
            raise InvalidListError(f"{name} must be a datetime, got {bound!r}")
        if bound.tzinfo is None or bound.utcoffset() is None:
            raise NaiveDatetimeError(f"{name} must be timezone-aware, got {bound!r}")
    if due_from is not None and due_before is not None and due_before <= due_from:
        raise InvalidListError(f"due_before ({due_before}) must be after due_from ({due_from})")


def check_count(name: str, value: object, low: int, high: int) -> None:
    """Refuse a count knob outside ``low..high``, naming it (services validate their
    configs with this, so every refusal reads the same)."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigurationError(f"{name} must be {low}..{high}, got {value!r}")


def check_duration(
    name: str, value: object, *, zero_ok: bool = False, at_most: timedelta | None = None
) -> None:
    """Refuse a duration knob that is not a timedelta, is negative (or zero, unless
    ``zero_ok``) or is longer than ``at_most``, naming it."""
    if not isinstance(value, timedelta):
        raise ConfigurationError(f"{name} must be a timedelta, got {value!r}")
    if value < timedelta(0) or (value == timedelta(0) and not zero_ok):
        raise ConfigurationError(f"{name} must be {'>=' if zero_ok else '>'} 0, got {value}")
    if at_most is not None and value > at_most:
        raise ConfigurationError(f"{name} must be at most {at_most}, got {value}")
