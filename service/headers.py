"""Security headers on every answer: no MIME sniffing, no referrer, no framing, and a strict CSP on HTML.

The dashboard's pages load nothing but their own stylesheet (``/ui/style.css``): no script, no inline style,
no form posting elsewhere, so a value that slipped through escaping could still neither run nor exfiltrate.
JSON answers get ``default-src 'none'`` (a browser opening one directly runs nothing either). The API's
HTML pages (``/docs``, ``/redoc``) load Swagger UI's and ReDoc's scripts from the application itself
(``/static-offline-docs``, fastapi-offline) and run an inline script: they get no CSP.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HTML_CSP = "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
DASHBOARD_PREFIX = "/ui"
API_CSP = "default-src 'none'; frame-ancestors 'none'"
COMMON = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


class SecurityHeaders:
    """ASGI middleware adding :data:`COMMON` to every HTTP answer, :data:`HTML_CSP` to the dashboard's
    (``/ui``) and :data:`API_CSP` to every answer that is not HTML; headers the route set itself are kept."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in COMMON.items():
                    headers.setdefault(name, value)
                if str(scope.get("path", "")).startswith(DASHBOARD_PREFIX):
                    headers.setdefault("Content-Security-Policy", HTML_CSP)
                elif not headers.get("content-type", "").startswith("text/html"):
                    headers.setdefault("Content-Security-Policy", API_CSP)
            await send(message)

        await self.app(scope, receive, send_with_headers)
