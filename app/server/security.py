"""The server's guards: API key, Host header, CORS origins and the bind address.

The rules: a loopback-bound server refuses requests whose Host is not loopback
(a DNS-rebinding page cannot reach it); browsers may call it only from loopback
origins and origins the user listed, never ``*``; and binding to any other
address needs an API key of at least :data:`MIN_REMOTE_KEY` characters.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})
MIN_REMOTE_KEY = 16  # characters of API key a server reachable from other machines needs


class ServerConfigError(ValueError):
    """The server cannot start as configured; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How the server listens and whom it lets in.

    Attributes:
        host: The address to bind.
        port: The TCP port; 0 picks a free one.
        api_key: The key clients must send as ``Authorization: Bearer``; ``None`` for none.
            Surrounding whitespace (a file's last newline) is dropped: a header
            cannot carry it, so keeping it would refuse every request.
        cors_origins: Origins besides loopback ones that browsers may call from.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.api_key is not None:
            object.__setattr__(self, "api_key", self.api_key.strip() or None)

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def url(self, port: int | None = None) -> str:
        """The base URL clients use (``/v1`` appended)."""
        host = self.host
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"  # reachable from this machine too
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port if port is None else port}/v1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, maybe in brackets) is this machine only."""
    host = host.strip().lower().strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_config(config: ServerConfig) -> None:
    """Refuses a configuration that would expose the engine.

    Raises:
        ServerConfigError: Non-loopback binding without an API key (or with one
            shorter than :data:`MIN_REMOTE_KEY`), or a bad port or origin.
    """
    if not 0 <= config.port <= 65535:
        raise ServerConfigError(f"Port {config.port} is not between 0 and 65535.")
    if not config.host.strip():
        raise ServerConfigError("The server needs an address to listen on.")
    if not config.loopback and not config.api_key:
        raise ServerConfigError(
            f"Listening on {config.host} makes Tandem reachable from other machines; "
            "set an API key first, or listen on 127.0.0.1."
        )
    if not config.loopback and len(config.api_key or "") < MIN_REMOTE_KEY:
        raise ServerConfigError(
            f"Listening on {config.host} needs an API key of at least {MIN_REMOTE_KEY} "
            "characters; a shorter one is easy to guess."
        )
    for origin in config.cors_origins:
        if origin.strip() == "*" or not urlsplit(origin).scheme:
            raise ServerConfigError(
                f"CORS origin '{origin}' must be a full origin such as https://app.example."
            )


def key_matches(header: str | None, api_key: str | None) -> bool:
    """Whether an ``Authorization`` header carries ``api_key``, compared in constant time.

    With no key configured every request passes. A header of any shape (bytes
    that are not UTF-8, control characters) is compared, never raised on.
    """
    if not api_key:
        return True
    if not header:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    # aiohttp keeps bytes that are not UTF-8 as surrogates; they cannot match a key.
    sent = token.strip().encode("utf-8", "surrogatepass")
    return hmac.compare_digest(sent, api_key.encode("utf-8", "surrogatepass"))


def host_name(host_header: str) -> str:
    """The name in a ``Host`` header, without the port."""
    host = host_header.strip()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        return host.split(":", 1)[0]
    return host  # a bare IPv6 address, or no port


def host_allowed(host_header: str | None, config: ServerConfig) -> bool:
    """Whether to serve a request with this ``Host`` header.

    A loopback-bound server serves only loopback hosts; one bound elsewhere
    (which needs a key) serves any.
    """
    if not config.loopback:
        return True
    if not host_header:
        return False
    return is_loopback(host_name(host_header))


def origin_allowed(origin: str, config: ServerConfig) -> bool:
    """Whether a browser page from ``origin`` may call the server."""
    origin = origin.strip()
    if origin in config.cors_origins:
        return True
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    return is_loopback(parts.hostname)
