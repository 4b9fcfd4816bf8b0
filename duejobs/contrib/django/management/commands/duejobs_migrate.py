"""``manage.py duejobs_migrate``: ``duejobs migrate`` with the project's settings."""

from duejobs.contrib.django.commands import CliCommand


class Command(CliCommand):
    help = (
        "duejobs migrate, with the URLs of the Django settings (options as for `duejobs migrate`)."
    )
    cli_command = "migrate"
