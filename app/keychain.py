"""Tandem's secrets in the system keychain, through ``keyring`` and nowhere else.

It keeps the Hugging Face token (:func:`get_token`), the keys of remote
engines (:func:`get_remote_key`), and says whether a keychain is usable at
all (:func:`keyring_status`), which the local server's key
(:mod:`app.server.api_key`) also asks. Free of Qt and of the rest of the app,
so the hub, the server and remote engines can all use it.

There is deliberately no fallback: when no keychain is usable the token cannot be
saved, and every function says why with a :class:`TokenStoreError`. The token is
never written to a file or a log, and no message here ever contains it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import keyring
import keyring.errors
from keyring.backend import KeyringBackend
from keyring.backends import chainer, fail, null

SERVICE = "Tandem"
USERNAME = "huggingface"

# Anything shaped like a Hugging Face token, hidden from messages as a last resort.
_TOKEN_SHAPE = re.compile(r"hf_[A-Za-z0-9]{8,}")
# keyrings.alt's file backends keep secrets in a file (or prompt on a terminal).
_FILE_BACKENDS = ("keyrings.alt.file",)


class TokenStoreError(Exception):
    """The token cannot be read, saved or deleted; the message is one line for the user."""


def keyring_status() -> str | None:
    """Says whether the token can be stored, without touching any stored secret.

    Returns:
        ``None`` when a usable keychain backend is active; otherwise a one-line
        reason why token storage is unavailable.
    """
    try:
        backend = keyring.get_keyring()
    except Exception as exc:  # backend discovery runs third-party plugins that fail in any way
        return f"token storage is unavailable: the keychain did not start ({scrub(exc)})"
    return _unusable(backend)


def get_token() -> str | None:
    """Reads the stored token.

    Returns:
        The token, or ``None`` when none is stored.

    Raises:
        TokenStoreError: The keychain is unavailable, locked or failed.
    """
    return _read(USERNAME, _TOKEN)


def set_token(token: str) -> None:
    """Stores ``token`` in the keychain, replacing any token stored before.

    Args:
        token: The Hugging Face access token; surrounding whitespace is dropped.

    Raises:
        ValueError: The token is empty or has whitespace inside.
        TokenStoreError: No usable keychain, or it refused; nothing was written elsewhere.
    """
    _write(USERNAME, _TOKEN, token)


def delete_token() -> None:
    """Deletes the stored token; deleting when none is stored is not an error.

    Raises:
        TokenStoreError: The keychain is unavailable, locked or failed.
    """
    _delete(USERNAME, _TOKEN)


@dataclass(frozen=True, slots=True)
class _Secret:
    """How messages name one kind of secret."""

    noun: str  # in "the token is empty"
    name: str  # in "cannot save the Hugging Face token: ..."
    storage: str  # replaces "token storage" in keyring_status's reason


_TOKEN = _Secret("token", "the Hugging Face token", "token storage")
_REMOTE_KEY = _Secret("key", "the server key", "key storage")


def _read(username: str, secret: _Secret) -> str | None:
    try:
        value = keyring.get_password(SERVICE, username)
    except Exception as exc:  # backends raise their own types (D-Bus, Security framework) too
        raise TokenStoreError(_failure("read", exc, secret)) from None
    return value or None


def _write(username: str, secret: _Secret, value: str) -> None:
    value = value.strip()
    if not value:
        raise ValueError(f"the {secret.noun} is empty")
    if any(c.isspace() for c in value):
        raise ValueError(f"the {secret.noun} has spaces or line breaks inside")
    # A null or empty backend accepts the secret and drops it; refuse instead of pretending.
    problem = keyring_status()
    if problem is not None:
        raise TokenStoreError(problem.replace("token storage", secret.storage))
    try:
        keyring.set_password(SERVICE, username, value)
    except Exception as exc:  # backends raise their own types (D-Bus, Security framework) too
        # from None: a backend's own message might quote what it was given.
        raise TokenStoreError(_failure("save", exc, secret, value)) from None


def _delete(username: str, secret: _Secret) -> None:
    try:
        keyring.delete_password(SERVICE, username)
    except keyring.errors.PasswordDeleteError as exc:
        # Backends raise this both for "nothing stored" and for real failures.
        if _read(username, secret) is not None:
            raise TokenStoreError(_failure("delete", exc, secret)) from None
    except Exception as exc:  # backends raise their own types (D-Bus, Security framework) too
        raise TokenStoreError(_failure("delete", exc, secret)) from None


def _stored(read: Callable[[], str | None]) -> str | None:
    """What ``read`` returns, or ``None`` when there is no usable keychain or it fails."""
    if keyring_status() is not None:
        return None
    try:
        return read()
    except TokenStoreError:
        return None


def _unusable(backend: KeyringBackend) -> str | None:
    if isinstance(backend, fail.Keyring):
        return "token storage is unavailable: no system keychain was found"
    if isinstance(backend, null.Keyring):
        return "token storage is unavailable: the keychain is turned off (keyring's null backend)"
    if isinstance(backend, chainer.ChainerBackend):
        try:
            chained = list(backend.backends)
        except Exception as exc:  # backend discovery runs third-party plugins
            return f"token storage is unavailable: the keychain did not start ({scrub(exc)})"
        if not chained:
            return "token storage is unavailable: no system keychain was found"
        # The chainer saves into its first backend, so that one decides.
        return _unusable(chained[0])
    if type(backend).__module__.startswith(_FILE_BACKENDS):
        return (
            "token storage is unavailable: the configured keyring backend keeps secrets in a file"
        )
    return None


def _failure(verb: str, exc: BaseException, secret: _Secret, value: str | None = None) -> str:
    if isinstance(exc, keyring.errors.NoKeyringError):
        return f"cannot {verb} {secret.name}: no system keychain was found"
    if isinstance(exc, keyring.errors.KeyringLocked):
        return f"cannot {verb} {secret.name}: the keychain is locked"
    return f"cannot {verb} {secret.name}: the keychain failed ({scrub(exc, value)})"


def scrub(exc: BaseException, token: str | None = None, limit: int = 200) -> str:
    """An exception as one line with any Hugging Face token hidden."""
    text = str(exc).strip()
    if token:
        text = text.replace(token, "***")
    # Hide before cutting, so a cut cannot leave a piece of a token behind.
    text = _TOKEN_SHAPE.sub("hf_***", text)
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def stored_token() -> str | None:
    """The saved token, or ``None`` when there is none or no usable keychain."""
    return _stored(get_token)


# Remote engines' bearer keys share the service; each is stored under its server's URL.
_REMOTE_PREFIX = "remote:"


def _remote_username(url: str) -> str:
    # Trailing slashes and case of the scheme and host do not make another server.
    url = url.strip().split("#", 1)[0].rstrip("/")
    scheme, sep, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return f"{_REMOTE_PREFIX}{scheme.lower()}{sep}{host.lower()}{slash}{path}"


def set_remote_key(url: str, key: str) -> None:
    """Stores the bearer key of the remote server at ``url``, replacing any before.

    Raises:
        ValueError: The key is empty or has whitespace inside.
        TokenStoreError: No usable keychain, or it refused; nothing was written elsewhere.
    """
    from app.logs import hide_secret

    hide_secret(key)
    _write(_remote_username(url), _REMOTE_KEY, key)


def get_remote_key(url: str) -> str | None:
    """Reads the bearer key stored for ``url``; ``None`` when none is stored.

    Raises:
        TokenStoreError: The keychain is unavailable, locked or failed.
    """
    return _read(_remote_username(url), _REMOTE_KEY)


def delete_remote_key(url: str) -> None:
    """Deletes the key stored for ``url``; deleting when none is stored is not an error.

    Raises:
        TokenStoreError: The keychain is unavailable, locked or failed.
    """
    _delete(_remote_username(url), _REMOTE_KEY)


def stored_remote_key(url: str) -> str | None:
    """The key saved for ``url``, or ``None`` when there is none or no usable keychain."""
    return _stored(lambda: get_remote_key(url))
