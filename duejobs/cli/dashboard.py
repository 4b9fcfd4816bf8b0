"""``duejobs dashboard``: the operator's pages served by uvicorn, on loopback or behind a
reverse proxy (``--proxy``, ``--public-url``; docs/dashboard.md shows the nginx block)."""

from __future__ import annotations

import os

import click

from duejobs.cli.base import _app, _fail
from duejobs.cli.group import main
from duejobs.errors import ConfigurationError, DuejobsError

DASHBOARD_PASSWORD_ENV = "DUEJOBS_DASHBOARD_PASSWORD"
_LOOPBACK_NAMES = ["127.0.0.1", "localhost", "[::1]", "::1"]


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option("--tenant", default=None, help="Show this tenant only (default: every tenant).")
@click.option(
    "--user", help=f"HTTP basic auth user; the password comes from ${DASHBOARD_PASSWORD_ENV}."
)
@click.option(
    "--actions", is_flag=True, help="Offer cancel, reschedule, retry, run now (needs --user)."
)
@click.option(
    "--refresh", type=click.IntRange(1, 3600), default=10, show_default=True, help="Seconds."
)
@click.option("--ssl-certfile", help="Serve HTTPS with this certificate (PEM).")
@click.option("--ssl-keyfile", help="The certificate's private key (PEM).")
@click.option(
    "--proxy",
    "proxies",
    multiple=True,
    metavar="ADDRESS",
    help="A reverse proxy's address whose X-Forwarded-For and -Proto are believed (repeat; "
    "needs --user).",
)
@click.option(
    "--public-url",
    metavar="URL",
    help="The address browsers use behind the proxy, e.g. https://ops.example.com/duejobs: "
    "its path is the dashboard's root, its origin and host are accepted.",
)
@click.pass_context
def dashboard(
    ctx: click.Context,
    host: str,
    port: int,
    tenant: str | None,
    user: str | None,
    actions: bool,
    refresh: int,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
    proxies: tuple[str, ...],
    public_url: str | None,
) -> None:
    """Serve the dashboard: overview, schedules, one schedule and its actions. Refuses a
    non-loopback --host, --actions and --proxy without authentication; without it, answers
    requests from this machine only."""
    try:
        import uvicorn

        from duejobs.dashboard import Access, create_dashboard, is_loopback
        from duejobs.dashboard.access import public_origin
    except ImportError as exc:
        _fail(
            DuejobsError(
                "the dashboard needs its extra (in a checkout: pip install "
                f"'.[binary,dashboard]'): {exc}"
            )
        )
    password = os.environ.get(DASHBOARD_PASSWORD_ENV) or None
    if (user is None) != (password is None):
        raise click.UsageError(f"--user and a non-empty ${DASHBOARD_PASSWORD_ENV} go together")
    if user is not None and not user.strip():
        raise click.UsageError("--user must not be empty")
    if (ssl_certfile is None) != (ssl_keyfile is None):
        raise click.UsageError("--ssl-certfile and --ssl-keyfile go together")
    try:
        public = public_origin(public_url) if public_url is not None else None
        access = Access(user=user, password=password, actions=actions, public_url=public_url)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--public-url") from None
    for name, given in (("--actions", actions), ("--proxy", proxies), ("--public-url", public)):
        if given and not access.authenticates:
            raise click.UsageError(f"{name} needs --user and ${DASHBOARD_PASSWORD_ENV}")
    if public is not None and not proxies:
        # Every request would come from the proxy's address: one sign-in limit for all,
        # which anyone could use up for everyone.
        raise click.UsageError("--public-url needs --proxy (the proxy's address)")
    if not is_loopback(host) and not access.authenticates:
        raise click.UsageError(
            f"--host {host} is reachable from other machines: set --user and "
            f"${DASHBOARD_PASSWORD_ENV}, or listen on 127.0.0.1"
        )
    # A loopback dashboard answers only its own names (and the public one behind a proxy):
    # a web page that rebinds its name to 127.0.0.1 gets no answer.
    hosts = [*_LOOPBACK_NAMES, host] if is_loopback(host) else None
    if public is not None:  # behind a proxy: its public name, whatever the address bound
        hosts = [*(hosts or [host]), public[1]]
    scheme = "https" if ssl_certfile else "http"
    with _app(ctx) as app:
        scoped = app.tenant(tenant) if tenant else app
        board = create_dashboard(scoped, access, refresh=refresh, allowed_hosts=hosts)
        click.echo(
            f"dashboard on {scheme}://{host}:{port}/ ({'actions' if actions else 'read-only'})"
            + (f", public as {public_url}" if public_url else "")
        )
        if scheme == "http" and not is_loopback(host):
            click.echo("warning: plain HTTP off loopback: serve it behind TLS", err=True)
        uvicorn.run(
            board,
            host=host,
            port=port,
            log_level="warning",
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            # Forwarded headers believed from the named proxies only (uvicorn's default
            # trusts 127.0.0.1); the public URL's path is the root every link starts with.
            proxy_headers=bool(proxies),
            forwarded_allow_ips=list(proxies) or None,
            root_path=public[2] if public is not None else "",
        )
