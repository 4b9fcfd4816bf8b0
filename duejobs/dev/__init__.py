"""Development tooling: PostgreSQL and Redis of duejobs' own, and the demo.

:mod:`.embedded` starts a PostgreSQL and a Redis (from the ``embedded`` extra's packages) that
``duejobs dev``, ``duejobs demo``, the test suite and the benchmarks use when no URL is set;
:mod:`.demo` is ``duejobs demo``. Nothing in a production process imports them.
"""
