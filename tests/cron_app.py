"""An App that declares a recurring definition next to its task, for the services' sync."""

from __future__ import annotations

from typing import Any

from duejobs import App, Context

app = App()


@app.task("digest.daily", cron="0 9 * * *", timezone="Europe/Lisbon")
def daily_digest(ctx: Context, payload: dict[str, Any]) -> None: ...
