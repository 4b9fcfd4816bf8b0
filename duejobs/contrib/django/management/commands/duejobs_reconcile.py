"""``manage.py duejobs_reconcile``: ``duejobs reconcile`` with the project's settings."""

from duejobs.contrib.django.commands import CliCommand


class Command(CliCommand):
    help = "`duejobs reconcile` with the URLs of the Django settings, and its options."
    cli_command = "reconcile"
