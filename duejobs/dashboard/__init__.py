"""The operator's dashboard: an ASGI app over an :class:`~duejobs.App` (see :mod:`.web`)."""

from duejobs.dashboard.web import Access, Pages, create_dashboard, is_loopback

__all__ = ["Access", "Pages", "create_dashboard", "is_loopback"]
