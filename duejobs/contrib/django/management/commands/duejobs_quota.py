"""``manage.py duejobs_quota``: ``duejobs quota`` (caps and rate limits of tenants) with the
project's settings."""

from duejobs.contrib.django.commands import CliCommand


class Command(CliCommand):
    help = "`duejobs quota [TENANT --max-live/--max-inflight/--max-rate]` with the settings."
    cli_command = "quota"
