"""Host and Origin checks, as ASGI middleware in front of every route.

- DNS rebinding: a page on attacker.example whose name is made to resolve to 127.0.0.1 reaches
  a loopback server with `Host: attacker.example`. A server bound to loopback therefore answers
  only to the loopback names (and to `--allowed-hosts`); every other Host gets 400.
- Cross-site websockets: browsers send `Origin` on websocket handshakes and never apply CORS
  to them, so any page could otherwise write to /ws/ingest or read /ws/live. A websocket whose
  Origin is present and names another host than the one it connects to is refused (403). The
  hook sends no Origin and is unaffected.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def default_allowed_hosts(bind_host: str) -> frozenset[str] | None:
    """Loopback names for a loopback bind; None (any Host) when bound to a public address."""
    return LOOPBACK_NAMES if bind_host in LOOPBACK_NAMES else None


def hostname(value: str) -> str:
    """The host name of a Host header or an Origin URL, lower-cased, without port or brackets."""
    netloc = urlsplit(value).netloc if "://" in value else value
    try:
        return (urlsplit(f"//{netloc}").hostname or "").lower()
    except ValueError:  # an unparsable header: matches nothing
        return ""


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            decoded: str = value.decode("latin-1")  # ASGI headers are bytes pairs
            return decoded
    return None


class HostGuard:
    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str] | None) -> None:
        self.app = app
        self.allowed = None if allowed_hosts is None else frozenset(hostname(h) or h.lower() for h in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            problem = self._problem(scope)
            if problem is not None:
                await self._refuse(scope, send, problem)
                return
        await self.app(scope, receive, send)

    def _problem(self, scope: Scope) -> str | None:
        host = hostname(_header(scope, b"host") or "")
        if self.allowed is not None and host not in self.allowed:
            return (
                f"Host {host!r} is not allowed: this server answers to {', '.join(sorted(self.allowed))}; "
                "start it with --allowed-hosts to add a name"
            )
        origin = _header(scope, b"origin")
        if scope["type"] == "websocket" and origin is not None and hostname(origin) != host:
            return f"websocket from origin {origin!r} refused: only pages served by this server may connect"
        return None

    async def _refuse(self, scope: Scope, send: Send, detail: str) -> None:
        if scope["type"] == "websocket":  # before accept: the handshake is answered 403
            await send({"type": "websocket.close", "code": 1008, "reason": detail[:120]})
            return
        body = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
