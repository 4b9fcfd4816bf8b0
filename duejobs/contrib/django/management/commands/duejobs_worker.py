"""``manage.py duejobs_worker``: ``duejobs worker`` with the project's settings."""

from duejobs.contrib.django.commands import CliCommand


class Command(CliCommand):
    help = "`duejobs worker` with the URLs of the Django settings, and its options."
    cli_command = "worker"
    takes_app = True
