"""The dashboard as its tests reach it: the address of a request from this machine, a signed-in
user's header, and a form's CSRF token."""

from __future__ import annotations

import base64
import re

# The address a request from this machine comes from (an unauthenticated dashboard answers
# no other).
LOCAL = ("127.0.0.1", 50000)
HERE = "http://127.0.0.1"  # and the name it asks for: a loopback one


def auth(user: str = "ops", password: str = "s3cret") -> dict[str, str]:
    """The header of a user signed in with Basic authentication."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def csrf(page: str) -> str:
    """The CSRF token of the first form on ``page``."""
    found = re.search(r'name="csrf" value="([0-9a-f.]+)"', page)
    assert found is not None, page
    return found[1]
