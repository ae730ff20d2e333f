"""API key, Host, CORS and bind-address rules."""

from __future__ import annotations

import pytest

from app.server.security import (
    MIN_REMOTE_KEY,
    ServerConfig,
    ServerConfigError,
    check_config,
    host_allowed,
    is_loopback,
    key_matches,
    origin_allowed,
)

LONG_KEY = "k" * MIN_REMOTE_KEY


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.2", "example.com", ""])
def test_other_hosts(host: str) -> None:
    assert not is_loopback(host)


def test_non_loopback_bind_needs_a_key() -> None:
    with pytest.raises(ServerConfigError, match="set an API key"):
        check_config(ServerConfig(host="0.0.0.0"))
    check_config(ServerConfig(host="0.0.0.0", api_key=LONG_KEY))
    check_config(ServerConfig())  # loopback without a key is fine


@pytest.mark.parametrize("key", ["ab", "x" * (MIN_REMOTE_KEY - 1), f" {'x' * 15}\n"])
def test_off_loopback_a_short_key_is_refused(key: str) -> None:
    with pytest.raises(ServerConfigError, match=f"at least {MIN_REMOTE_KEY} characters"):
        check_config(ServerConfig(host="0.0.0.0", api_key=key))
    check_config(ServerConfig(api_key=key))  # on loopback any key will do


def test_a_key_read_with_its_newline_matches_the_key_sent() -> None:
    config = ServerConfig(api_key=f"{LONG_KEY}\n")
    assert key_matches(f"Bearer {LONG_KEY}", config.api_key)
    assert ServerConfig(api_key=" \n").api_key is None  # only whitespace: no key


def test_wildcard_cors_is_refused() -> None:
    with pytest.raises(ServerConfigError, match="CORS origin"):
        check_config(ServerConfig(cors_origins=("*",)))


def test_key_check() -> None:
    assert key_matches(None, None)
    assert key_matches("Bearer k1", "k1")
    assert key_matches("bearer k1", "k1")
    assert not key_matches("Bearer k2", "k1")
    assert not key_matches("k1", "k1")
    assert not key_matches(None, "k1")


def test_host_check_on_loopback() -> None:
    config = ServerConfig()
    for header in ("127.0.0.1:8080", "localhost:8080", "localhost", "[::1]:8080"):
        assert host_allowed(header, config), header
    bad: tuple[str | None, ...] = ("evil.example", "evil.example:8080", "192.168.1.2:8080", None)
    for wrong in bad:
        assert not host_allowed(wrong, config), wrong
    assert host_allowed("192.168.1.2:8080", ServerConfig(host="0.0.0.0", api_key=LONG_KEY))


def test_origins() -> None:
    config = ServerConfig(cors_origins=("https://app.example",))
    assert origin_allowed("http://localhost:3000", config)
    assert origin_allowed("http://127.0.0.1:5173", config)
    assert origin_allowed("https://app.example", config)
    assert not origin_allowed("https://evil.example", config)
    assert not origin_allowed("null", config)
    assert not origin_allowed("http://localhost.evil.example", config)


def test_urls() -> None:
    assert ServerConfig(port=9000).url() == "http://127.0.0.1:9000/v1"
    assert ServerConfig(host="0.0.0.0", api_key="k").url(1234) == "http://127.0.0.1:1234/v1"
    assert ServerConfig(host="::1").url() == "http://[::1]:8080/v1"
