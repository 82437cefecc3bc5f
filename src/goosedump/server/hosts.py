"""Which names a server on a loopback address answers to (serve's
--allowed-hosts): a defence against DNS rebinding, as ollama's.

A web page on a site whose name its owner points, after the page has
loaded, at 127.0.0.1 calls the server as its own origin: the browser sends
neither a preflight nor an Origin that CORS could refuse (a same-origin GET
sends none at all), and the page reads every answer. What gives it away is
the Host header, which carries the site's name. So a server listening on a
loopback address answers only requests whose Host is an address (a page
cannot rebind an address), `localhost` or a name under it, this machine's
own name, or a name under `.local` or `.internal` (a LAN's or a container
host's names, which a site on the web does not control), as ollama does.
A server listening on another address is called by whatever names reach
it, so by default it checks nothing; `--allowed-hosts` names more hosts
(a reverse proxy that passes its own Host on, e.g. Caddy's) and checks
them on every address, and `*` turns the check off."""
from __future__ import annotations

import ipaddress
import re
import socket

from starlette.datastructures import Headers

from .errors import APIError

LOCAL_SUFFIXES = (".localhost", ".local", ".internal")
NAME = re.compile(r"(\*\.)?[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")


class HostsError(ValueError):
    pass


def parse_hosts(text: str) -> list[str] | None:
    """--allowed-hosts as the names it adds (lower case; `*.example.com`
    allows the names under example.com), or None for '*' (no check)."""
    words = [w.strip().lower().removesuffix(".") for w in text.split(",") if w.strip()]
    if "*" in words:
        if len(words) > 1:
            raise HostsError(f"--allowed-hosts {text!r}: '*' stands alone (it allows every name)")
        return None
    for w in words:
        if w != "local" and not NAME.fullmatch(w):
            raise HostsError(f"--allowed-hosts: {w!r} is not a host name (e.g. llm.example.com or "
                             f"*.example.com, without scheme or port), nor local or '*'")
    if not words:
        raise HostsError(f"--allowed-hosts {text!r}: no name (give names, local or '*')")
    return [w for w in words if w != "local"]


def is_loopback(host: str) -> bool:
    """Whether a bind address (serve's --host) listens on loopback only."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a Host header (its port and an IPv6 address's brackets
    off; lower case, without a trailing dot)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header[1:]
    return header.rpartition(":")[0].removesuffix(".") if ":" in header else header.removesuffix(".")


def checked_hosts(bind: str, flag: str = "local") -> list[str] | None:
    """What create_app checks for a server bound to `bind` with
    --allowed-hosts `flag`: the names it answers besides addresses,
    localhost and the local suffixes (this machine's name, taken here, where
    the server listens, not in a replica on another node, and the flag's),
    or None where it checks nothing."""
    extra = parse_hosts(flag)
    if extra is None or (not extra and not is_loopback(bind)):
        return None
    return [socket.gethostname().lower().removesuffix("."), *extra]


class HostCheck:
    """ASGI: a request whose Host is none of the allowed names is refused
    with a 403 that says how to allow it (outermost: before CORS answers a
    preflight)."""

    def __init__(self, app, extra: list[str]):
        self.app = app
        self.exact = {"localhost", *(n for n in extra if not n.startswith("*."))}
        self.suffixes = LOCAL_SUFFIXES + tuple(n[1:] for n in extra if n.startswith("*."))

    def allowed(self, name: str) -> bool:
        if not name or name in self.exact or name.endswith(self.suffixes):
            return True
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return False

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            header = Headers(scope=scope).get("host", "")
            if not self.allowed(host_name(header)):
                shown = repr(header[:200])
                error = APIError(403, f"this server does not answer to the host name {shown}: it listens on a "
                                      f"loopback address, where another name is what a web page that rebinds its "
                                      f"own name to this machine would send; start it with --allowed-hosts NAME "
                                      f"to allow one (a reverse proxy's), or '*' for any",
                                 code="host_not_allowed")
                return await error.response(scope["path"])(scope, receive, send)
        await self.app(scope, receive, send)
