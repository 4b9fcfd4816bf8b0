"""``manage.py duejobs_rate_limit``: ``duejobs rate-limit`` with the project's settings."""

from duejobs.contrib.django.commands import CliCommand


class Command(CliCommand):
    help = "`duejobs rate-limit [QUEUE RATE|none]` with the URLs of the Django settings."
    cli_command = "rate-limit"
