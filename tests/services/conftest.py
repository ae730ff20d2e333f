"""Fixtures of the service tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pytestqt.qtbot import QtBot

from app.services import EngineService, EngineWorker


@pytest.fixture
def make_service(qtbot: QtBot) -> Iterator:
    services: list[EngineService] = []

    def make(worker: EngineWorker | None = None) -> EngineService:
        service = EngineService(worker)
        services.append(service)
        return service

    yield make
    for service in services:
        assert service.shutdown()
