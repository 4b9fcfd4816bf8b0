"""OpenTelemetry traces that survive the delay (the optional extra ``duejobs[otel]``).

``schedule()`` keeps the caller's trace context (W3C ``traceparent``) with the schedule; the
worker's span for each attempt *links* to it, or is its *child* when the App that scheduled it
asks (``App(trace_runs="child")``): the run, minutes or days later, shows up under the request
that scheduled it.

Spans: ``duejobs.schedule`` (App.schedule), ``duejobs.scheduler.pass`` (a scheduler pass:
claimed, queued, deferred), ``duejobs.claim`` (the worker's claim of a delivery),
``duejobs.attempt <type>`` (one attempt, with ``duejobs.handler`` and ``duejobs.outcome``
inside). Attributes: ``duejobs.schedule_id``, ``.version``, ``.attempt``, ``.tenant``,
``.type``, ``.lag_ms``, ``.outcome``.

What it promises: no span, and no trace context kept, when OpenTelemetry is not installed or
no SDK tracer provider is configured — the check is one ``isinstance`` per call. What it does
not: record ``schedule_many``'s or a recurring occurrence's context (neither has a caller's
request to come from), or carry baggage. A handler given up past its timeout is closed from
a thread of its own, whose ``duejobs.outcome`` span starts a trace of its own; and a worker
that then ends itself (``EXIT_WEDGED``) does not flush the spans its exporter still holds.
``duejobs.handler`` is marked as an error when a handler ends by ``ctx.ensure_current()``
(the schedule moved under it) — the attempt's own ``duejobs.outcome`` attribute says how it
ended.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import trace as _trace
    from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER
    from opentelemetry.trace import Link, ProxyTracerProvider, Span, Tracer, TracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: TraceContextTextMapPropagator | None = TraceContextTextMapPropagator()
    # A provider named by the environment, which the API loads on first use.
    _FROM_ENVIRONMENT = OTEL_PYTHON_TRACER_PROVIDER in os.environ
except ImportError:  # the extra is not installed: no span, ever
    _PROPAGATOR = None

_UNKNOWN = object()

LINK, CHILD = "link", "child"
TRACE_RUNS = (LINK, CHILD)


def _tracer() -> Tracer | None:
    """duejobs' tracer, or None when OpenTelemetry is absent or not configured."""
    if _PROPAGATOR is None:
        return None
    # The provider set, read where the API keeps it: get_tracer_provider() looks the
    # environment up each time none is set (an exception inside os.environ, four times a
    # job, a tenth of a busy worker's time); through the API where that place is not found.
    kept: object = getattr(_trace, "_TRACER_PROVIDER", _UNKNOWN)
    if kept is None and not _FROM_ENVIRONMENT:
        return None
    provider = kept if isinstance(kept, TracerProvider) else _trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider):  # nothing set it: the API's no-op default
        return None
    return provider.get_tracer("duejobs")


def attributes(**values: Any) -> dict[str, Any]:
    """Span attributes under ``duejobs.``, the empty ones left out."""
    return {f"duejobs.{k}": v for k, v in values.items() if v is not None and v != ""}


@contextlib.contextmanager
def span(name: str, **values: Any) -> Iterator[Span | None]:
    """A span around a step (None when tracing is off)."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(name, attributes=attributes(**values)) as current:
        yield current


def recorded(mode: str) -> str | None:
    """The current trace context to keep with a schedule — ``"<mode> <traceparent>"`` — or
    None (tracing off, or no span is current)."""
    if _tracer() is None or _PROPAGATOR is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    parent = carrier.get("traceparent")
    return None if parent is None else f"{mode} {parent}"


@contextlib.contextmanager
def attempt(job_type: str, kept: str | None, **values: Any) -> Iterator[Span | None]:
    """The span of one attempt: a child of the kept context, or linked to it."""
    tracer = _tracer()
    if tracer is None or _PROPAGATOR is None:
        yield None
        return
    links: list[Link] = []
    parent = None
    if kept:
        mode, _, traceparent = kept.partition(" ")
        extracted = _PROPAGATOR.extract({"traceparent": traceparent})
        context = _trace.get_current_span(extracted).get_span_context()
        if context.is_valid and mode == CHILD:
            parent = extracted
        elif context.is_valid:
            links.append(Link(context))
    with tracer.start_as_current_span(
        f"duejobs.attempt {job_type}",
        context=parent,
        links=links,
        attributes=attributes(type=job_type, **values),
    ) as current:
        yield current
