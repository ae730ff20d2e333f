"""Remote engines' bearer keys in the keychain, per server URL."""

from __future__ import annotations

import keyring
import pytest
from keyring.backends import fail

from app.keychain import (
    TokenStoreError,
    delete_remote_key,
    get_remote_key,
    get_token,
    set_remote_key,
    stored_remote_key,
)
from tests.fakes import MemoryKeyring


def test_keys_are_kept_per_server(memory: MemoryKeyring) -> None:
    set_remote_key("http://Studio.local:8080/", " sk-one ")
    set_remote_key("https://gpu.example:8000", "sk-two")
    assert get_remote_key("http://studio.local:8080") == "sk-one"
    assert get_remote_key("https://gpu.example:8000#kind=vllm") == "sk-two"
    assert get_token() is None  # the Hugging Face token is another entry
    delete_remote_key("http://studio.local:8080")
    assert get_remote_key("http://studio.local:8080") is None
    delete_remote_key("http://studio.local:8080")  # again: not an error
    assert stored_remote_key("https://gpu.example:8000") == "sk-two"


@pytest.mark.parametrize("bad", ["", "  ", "sk one"])
def test_malformed_keys_are_refused(memory: MemoryKeyring, bad: str) -> None:
    with pytest.raises(ValueError):
        set_remote_key("http://h:1", bad)


def test_no_keychain_says_why(use_keyring: None) -> None:
    keyring.set_keyring(fail.Keyring())
    with pytest.raises(TokenStoreError, match=r"^key storage is unavailable") as err:
        set_remote_key("http://h:1", "sk-secret")
    assert "sk-secret" not in str(err.value)
    assert stored_remote_key("http://h:1") is None
