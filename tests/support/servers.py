"""The servers of a test session and the schema mode the suite runs in."""

from __future__ import annotations

import os

from duejobs.testing.servers import TestServers

# The time zone of every session on the test database (see the ``database_url`` fixture).
SESSION_ZONE = "America/New_York"
# DUEJOBS_TEST_PARTITIONED=1: the whole suite on partitioned mode (daily partitions).
PARTITIONED = os.environ.get("DUEJOBS_TEST_PARTITIONED") == "1"
# duejobs' tables and the test handlers' own, emptied before each test that takes an App.
TABLES = (
    "scheduled_jobs, scheduled_job_events, scheduled_job_attempts, scheduled_job_effects, "
    "scheduled_job_results, recurring_schedules, tenant_quotas, rate_limits, test_effects, "
    "test_runs" + (", scheduled_job_keys" if PARTITIONED else "")
)


class Servers(TestServers):
    """The servers of this test session (``DUEJOBS_DATABASE_URL`` and ``DUEJOBS_REDIS_URL``,
    both or neither: else the embedded ones) and the scratch database created on one."""

    def describe(self) -> str:
        mode = "partitioned mode" if PARTITIONED else "plain schema"
        return f"{super().describe()} ({mode})"
