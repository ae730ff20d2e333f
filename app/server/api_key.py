"""The local server's API key, kept in the system keychain through ``keyring`` only.

Like the Hugging Face token, the key never goes to the settings file or a log;
with no usable keychain it cannot be saved, and the server then allows only
loopback without a key.
"""

from __future__ import annotations

import keyring

from app.keychain import keyring_status
from app.logs import hide_secret

SERVICE = "Tandem"
USERNAME = "server-api-key"


class ApiKeyStoreError(Exception):
    """The key cannot be read, saved or deleted; the message is one line for the user."""


def key_storage_status() -> str | None:
    """``None`` when the key can be stored, else one line saying why not."""
    reason = keyring_status()
    if reason is None:
        return None
    return reason.replace("token storage", "API key storage")


def get_api_key() -> str | None:
    """The stored key, or ``None`` (also when no keychain is usable)."""
    if key_storage_status() is not None:
        return None
    try:
        key = keyring.get_password(SERVICE, USERNAME) or None
    except Exception as exc:  # backends raise their own types
        raise ApiKeyStoreError(f"cannot read the API key: {type(exc).__name__}") from None
    hide_secret(key)  # from now on no log record holds it
    return key


def set_api_key(key: str | None) -> None:
    """Stores ``key``, or deletes the stored key when it is empty or ``None``.

    Raises:
        ValueError: The key has whitespace inside.
        ApiKeyStoreError: No usable keychain, or it refused.
    """
    key = (key or "").strip()
    if any(c.isspace() for c in key):
        raise ValueError("The API key has spaces or line breaks inside.")
    problem = key_storage_status()
    if problem is not None:
        raise ApiKeyStoreError(problem)
    try:
        if key:
            keyring.set_password(SERVICE, USERNAME, key)
        elif keyring.get_password(SERVICE, USERNAME) is not None:
            keyring.delete_password(SERVICE, USERNAME)
    except Exception as exc:  # backends raise their own types
        raise ApiKeyStoreError(f"cannot save the API key: {type(exc).__name__}") from None
