"""What every bench test shares."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _attention_mode_kept() -> Iterator[None]:
    """`tandem bench` sets the verification attention for its process; keep this one's."""
    from app.engine import attention

    saved = dict(attention._state)
    yield
    attention._state.clear()
    attention._state.update(saved)
