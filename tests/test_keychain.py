"""The Hugging Face token in the keychain, with in-memory and failing keyring backends."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import keyring
import keyring.errors
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import chainer, fail, null

from app import keychain as secrets
from app.keychain import (
    TokenStoreError,
    delete_token,
    get_token,
    keyring_status,
    set_token,
)
from tests.fakes import MemoryKeyring

TOKEN = "hf_KeychainTestToken0123456789abcdef"


class PlaintextKeyring(MemoryKeyring):
    """Stands in for keyrings.alt's file backend."""


PlaintextKeyring.__module__ = "keyrings.alt.file"


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text
    assert TOKEN not in text
    return text


def test_round_trip(memory: MemoryKeyring) -> None:
    assert keyring_status() is None
    assert get_token() is None

    set_token(f"  {TOKEN}\n")  # pasted with whitespace around it
    assert memory.store == {("Tandem", "huggingface"): TOKEN}
    assert get_token() == TOKEN

    set_token(TOKEN + "x")  # replaces
    assert get_token() == TOKEN + "x"

    delete_token()
    assert get_token() is None
    assert memory.store == {}
    delete_token()  # nothing stored: not an error


@pytest.mark.parametrize("bad", ["", "   ", "hf_abc def", "hf_abc\ndef"])
def test_malformed_tokens_are_refused(memory: MemoryKeyring, bad: str) -> None:
    with pytest.raises(ValueError):
        set_token(bad)
    assert memory.store == {}


def test_no_keychain_at_all(use_keyring: None) -> None:
    keyring.set_keyring(fail.Keyring())
    reason = keyring_status()
    assert reason is not None and "\n" not in reason
    assert "no system keychain" in reason
    for call in (get_token, lambda: set_token(TOKEN), delete_token):
        with pytest.raises(TokenStoreError) as caught:
            call()
        assert "no system keychain" in one_line(caught.value)


def test_null_backend_is_not_a_place_to_keep_the_token(use_keyring: None) -> None:
    keyring.set_keyring(null.Keyring())
    reason = keyring_status()
    assert reason is not None and "turned off" in reason
    with pytest.raises(TokenStoreError) as caught:
        set_token(TOKEN)
    assert one_line(caught.value) == reason


def test_chainer_without_backends(use_keyring: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chainer.ChainerBackend, "backends", [])
    keyring.set_keyring(chainer.ChainerBackend())
    assert "no system keychain" in (keyring_status() or "")
    with pytest.raises(TokenStoreError):
        set_token(TOKEN)


def test_chainer_decides_by_its_first_backend(
    use_keyring: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chainer.ChainerBackend, "backends", [MemoryKeyring()])
    keyring.set_keyring(chainer.ChainerBackend())
    assert keyring_status() is None
    monkeypatch.setattr(chainer.ChainerBackend, "backends", [PlaintextKeyring(), MemoryKeyring()])
    assert "keeps secrets in a file" in (keyring_status() or "")


def test_a_file_backend_is_refused(use_keyring: None) -> None:
    backend = PlaintextKeyring()
    keyring.set_keyring(backend)
    assert "keeps secrets in a file" in (keyring_status() or "")
    with pytest.raises(TokenStoreError):
        set_token(TOKEN)
    assert backend.store == {}


def test_backend_that_fails_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> KeyringBackend:
        raise keyring.errors.InitError("D-Bus is not running")

    monkeypatch.setattr(keyring, "get_keyring", broken)
    reason = keyring_status()
    assert (
        reason == "token storage is unavailable: the keychain did not start (D-Bus is not running)"
    )


def test_locked_keychain(memory: MemoryKeyring) -> None:
    memory.error = keyring.errors.KeyringLocked("Failed to unlock the collection!")
    for call in (get_token, lambda: set_token(TOKEN), delete_token):
        with pytest.raises(TokenStoreError) as caught:
            call()
        assert "the keychain is locked" in one_line(caught.value)


def test_failures_never_show_the_token(memory: MemoryKeyring) -> None:
    # A backend whose error quotes what it was given.
    memory.error = keyring.errors.PasswordSetError(f"cannot store {TOKEN}\nsecond line")
    with pytest.raises(TokenStoreError) as caught:
        set_token(TOKEN)
    assert one_line(caught.value) == (
        "cannot save the Hugging Face token: the keychain failed (cannot store ***)"
    )
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__

    memory.error = RuntimeError(f"odd backend said {TOKEN}")  # not a KeyringError
    with pytest.raises(TokenStoreError) as caught:
        get_token()
    assert one_line(caught.value) == (
        "cannot read the Hugging Face token: the keychain failed (odd backend said hf_***)"
    )


def test_delete_failure_is_reported_when_the_token_stays(
    memory: MemoryKeyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_token(TOKEN)

    def refuse(service: str, username: str) -> None:
        raise keyring.errors.PasswordDeleteError("access denied")

    monkeypatch.setattr(memory, "delete_password", refuse)
    with pytest.raises(TokenStoreError) as caught:
        delete_token()
    assert "access denied" in one_line(caught.value)
    assert get_token() == TOKEN


def test_token_goes_nowhere_but_the_keyring(
    memory: MemoryKeyring, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    home = Path(os.environ["HOME"])
    set_token(TOKEN)
    assert get_token() == TOKEN
    delete_token()
    assert TOKEN not in caplog.text
    for file in home.rglob("*"):
        if file.is_file() and file.stat().st_size < 10_000_000:
            assert TOKEN.encode() not in file.read_bytes(), file
    assert secrets.SERVICE == "Tandem" and secrets.USERNAME == "huggingface"


def test_stored_token_is_none_without_a_keychain(memory: MemoryKeyring, use_keyring: None) -> None:
    from app.keychain import stored_token

    keyring.set_keyring(memory)
    set_token(TOKEN)
    assert stored_token() == TOKEN
    keyring.set_keyring(fail.Keyring())
    assert stored_token() is None  # a download then goes without one, never fails on it
