"""The dashboard's pages: one server-rendered shell per page, filled and kept fresh by ``static/dashboard.js``.

Every page is the same view over its own template: navigation, the CSRF token, who is signed in
and what they may do; the data comes from the admin REST API (``mount.api_base``).
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, render_template, request

from .context import Dashboard, Mount
from .history import CHARTS, RANGES
from .session import Session

# (name: its template and endpoint, path under the mount, the navigation's words), in the
# navigation's order.
PAGES = (
    ("fleet", "", "Fleet"),
    ("models", "models", "Models"),
    ("find", "find", "Find a model"),
    ("usage", "usage", "Usage"),
    ("capacity", "capacity", "Capacity"),
    ("keys", "keys", "Keys"),
    ("history", "history", "History"),
    ("audit", "audit", "Audit"),
)
# How often the pages poll the API, in milliseconds.
REFRESH_MS = 3000


def add_page_views(bp: Blueprint, dash: Dashboard, mount: Mount) -> None:
    url = mount.url

    async def page(name: str, session: Session | None, key: Any) -> str:
        return await render_template(
            f"{name}.html",
            page=name,
            pages=PAGES,
            url=url,
            api_base=mount.api_base,
            login=mount.login,
            csrf=session.csrf if session else "",
            who=key.name if key is not None else "",
            read_only=key is not None and not key.admin,
            prometheus=bool(dash.prometheus),
            charts=CHARTS,
            ranges=RANGES,
            refresh_ms=REFRESH_MS,
            static=url("dashboard-static/"),
        )

    def found() -> tuple[Session | None, Any]:
        if not mount.login:
            return None, None
        result = dash.session_of(request.headers)
        return result if result is not None else (None, None)

    for name, path, _ in PAGES:

        def make(name: str = name) -> Any:
            async def view() -> Any:
                session, key = found()
                return await page(name, session, key)

            view.__name__ = f"page_{name}"
            return view

        bp.add_url_rule(f"/{path}", f"page_{name}", make(), methods=["GET"])
