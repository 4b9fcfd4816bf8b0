"""The handler's context, where handlers' modules import it from
(``from duejobs.context import Context``); it lives with the worker
(:mod:`duejobs.worker.context`)."""

from duejobs.worker.context import Context

__all__ = ["Context"]
