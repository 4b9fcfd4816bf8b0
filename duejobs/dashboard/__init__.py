"""The operator's dashboard: an ASGI app over an :class:`~duejobs.App` (see :mod:`.web`)."""

from duejobs.dashboard.access import Access, is_loopback
from duejobs.dashboard.web import Pages, create_dashboard

__all__ = ["Access", "Pages", "create_dashboard", "is_loopback"]
