"""``manage.py duejobs_scheduler``: ``duejobs scheduler`` with the project's settings."""

from duejobs.contrib.django.commands import CliCommand


class Command(CliCommand):
    help = "`duejobs scheduler` with the URLs of the Django settings, and its options."
    cli_command = "scheduler"
    takes_app = True
