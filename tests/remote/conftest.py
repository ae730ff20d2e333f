"""A real mlx_lm.server on the tiny target, started once for the remote tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import TinyModels
from tests.remote.servers import mlx_server


@pytest.fixture(scope="session")
def mlx_url(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("mlx-server") / "server.log"
    with mlx_server(tiny.target, log) as url:
        yield url
