"""The operator's dashboard: an ASGI app over an :class:`~duejobs.App` (see :mod:`.web`)."""

from duejobs.dashboard.web import Access, create_dashboard, is_loopback

__all__ = ["Access", "create_dashboard", "is_loopback"]
