"""The Qt binding itself must not corrupt the interpreter."""

from __future__ import annotations

import sys

import pytest
from PySide6.QtWidgets import QLineEdit
from pytestqt.qtbot import QtBot


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="None is immortal from Python 3.12 on")
def test_void_qt_calls_keep_none_alive(qtbot: QtBot) -> None:
    # PySide6 6.12.0 dropped a reference to None on every void call, which
    # aborted the process once the count reached zero.
    edit = QLineEdit()
    qtbot.addWidget(edit)
    before = sys.getrefcount(None)
    for _ in range(2000):
        edit.setEnabled(True)
    assert sys.getrefcount(None) >= before - 50
