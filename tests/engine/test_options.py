"""Engine options: one frozen value per decoder, checked once, in force while it runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.engine import GenerationParams, attention, load_pair, wide
from app.engine.decoder import Decoder, take_turns
from app.engine.observe import EngineEvent, PromptCopied
from app.engine.options import EngineOptions
from app.engine.types import DraftSetting
from tests.conftest import TinyModels


@pytest.fixture(autouse=True)
def _defaults_after() -> Iterator[None]:
    yield
    EngineOptions().apply()


@pytest.mark.parametrize(
    "bad", [dict(attention="fast"), dict(wide=0), dict(wide="wide"), dict(probe_every=-1)]
)
def test_a_bad_option_is_refused_where_the_options_are_made(bad) -> None:
    with pytest.raises(ValueError):
        EngineOptions(**bad)


def test_each_decoder_runs_its_replies_on_its_own_paths_and_leaves_the_processs(
    tiny: TinyModels,
) -> None:
    target = load_pair(tiny.target).target.model
    matmul = Decoder(target, options=EngineOptions(attention="matmul", wide="off"))
    sdpa = Decoder(target, options=EngineOptions(attention="sdpa", wide=64))
    seen: list[tuple[str, object]] = []

    def forwards(event: EngineEvent) -> None:  # told on the engine thread, amid its forwards
        if not isinstance(event, PromptCopied):  # a kept cache's rows: copied as a reply opens
            seen.append((attention.mode(), wide.mode()))

    for decoder in (matmul, sdpa):
        decoder.subscribe(forwards)
    params = GenerationParams(drafting=DraftSetting.of(0), max_tokens=4)
    EngineOptions(attention="bucketed", wide="auto").apply()  # the process's own
    for decoder, paths in ((matmul, ("matmul", "off")), (sdpa, ("sdpa", 64)), (matmul, None)):
        seen.clear()
        take_turns([decoder.generate([30, 31, 32], params)], 4)
        assert seen and set(seen) == {paths or ("matmul", "off")}
        assert (attention.mode(), wide.mode()) == ("bucketed", "auto")  # nothing leaks
