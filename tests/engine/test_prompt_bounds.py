"""A prompt's cost is bounded: by the window before it is tokenized, by a deadline as it renders."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.engine import Finished, GenerationParams, Message, load_pair
from app.engine.decoder import Decoder
from app.engine.generate import (
    COUNT_CHUNK,
    PromptTooLongError,
    encode_chat,
    new_decoder,
    stream_reply,
)
from app.engine.loader import ModelPair
from app.engine.types import DraftSetting
from app.errors import ModelError
from tests.conftest import TinyModels
from tests.fakes import _tandem_here


def _with(tiny: TinyModels, tmp_path: Path, name: str, **changes: Any) -> Path:
    """A copy of the tiny target with ``template`` and ``window`` changed."""
    folder = shutil.copytree(tiny.target, tmp_path / name)
    if "template" in changes:
        path = folder / "tokenizer_config.json"
        config = json.loads(path.read_text())
        config["chat_template"] = changes["template"]
        path.write_text(json.dumps(config))
    if "window" in changes:
        path = folder / "config.json"
        config = json.loads(path.read_text())
        config["max_position_embeddings"] = changes["window"]
        path.write_text(json.dumps(config))
    return folder


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The length of every text the tokenizer is asked to encode, from any thread."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    lengths: list[int] = []
    original = TokenizersBackend._encode_plus

    def recording(self: Any, text: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(text, str):
            lengths.append(len(text))
        return original(self, text, *args, **kwargs)

    monkeypatch.setattr(TokenizersBackend, "_encode_plus", recording)
    yield lengths


# --- 14: a prompt far past the window is refused before it is tokenized whole -----------------


def test_a_template_that_repeats_a_short_message_past_the_window_is_refused_in_chunks(
    tiny: TinyModels, tmp_path: Path, encoded: list[int]
) -> None:
    # The message alone is shorter than the window; the template makes it megabytes.
    template = (
        "{% for m in messages %}{% for i in range(2000) %}{{ m.content }}{% endfor %}"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    pair = load_pair(_with(tiny, tmp_path, "repeats", template=template))
    window = pair.target.context_length
    assert window is not None
    message = [Message("user", "The quick brown fox. " * 100)]
    with pytest.raises(PromptTooLongError, match="at least"):
        list(stream_reply(pair, message, GenerationParams(max_tokens=4)))
    assert encoded and max(encoded) <= min(COUNT_CHUNK, window)


# --- 22: prompt and reply share the window ------------------------------------------------------


def _near_the_end(pair: ModelPair, room: int) -> list[Message]:
    """A conversation that leaves about ``room`` tokens of the pair's window."""
    window = pair.target.context_length
    assert window is not None
    words = 1
    while len(encode_chat(pair.target.tokenizer, [Message("user", "word " * words)])) < (
        window - room
    ):
        words += 8
    return [Message("user", "word " * words)]


@pytest.mark.parametrize("lane", ["own decoder", "batch"])
def test_the_reply_is_capped_at_what_the_window_leaves_and_says_so(
    tiny: TinyModels, tmp_path: Path, lane: str
) -> None:
    pair = load_pair(_with(tiny, tmp_path, "short", window=256), tiny.copy)
    messages = _near_the_end(pair, 16)
    decoder = new_decoder(pair)
    if lane == "batch":
        draft = pair.draft.model if pair.draft is not None else None
        decoder = Decoder(pair.target.model, draft, decoder.costs)  # type: ignore[assignment]
    params = GenerationParams(max_tokens=200, temperature=0.0, drafting=DraftSetting.of(3))
    events = list(stream_reply(pair, messages, params, decoder=decoder))
    end = events[-1]
    assert isinstance(end, Finished)
    s = end.stats
    assert 200 > 256 - s.prompt_tokens > 0
    assert end.finish_reason == "length" and s.capped_by_window
    assert s.prompt_tokens + s.tokens == 256 == len(end.token_ids) + s.prompt_tokens
    assert s.as_dict()["capped_by_window"] is True


def test_a_reply_that_ends_inside_the_window_is_not_called_capped(tiny_pair) -> None:
    params = GenerationParams(max_tokens=6, temperature=0.0)
    end = list(stream_reply(tiny_pair, [Message("user", "Hi")], params))[-1]
    assert isinstance(end, Finished)
    assert end.stats.tokens == 6 and not end.stats.capped_by_window


def test_tandem_generate_says_in_one_line_that_the_window_cut_the_reply(
    tiny: TinyModels, tmp_path: Path
) -> None:
    folder = _with(tiny, tmp_path, "short", window=64)
    r = _tandem_here(
        "generate", "--model", str(folder), "--max-tokens", "200", "--json", "word " * 8
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["finish_reason"] == "length" and out["capped_by_window"] is True
    assert out["prompt_tokens"] + out["tokens"] == 64
    said = [line for line in r.stderr.splitlines() if "window" in line]
    assert said == [
        f"tandem: the reply stopped at the end of short's window of 64 tokens "
        f"({out['prompt_tokens']} of them the prompt)"
    ]


# --- 23: a chat template is bounded in time and recursion ---------------------------------------

HOSTILE = {
    "nested loops": (
        "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}"
    ),
    "loops over a list made once": (
        "{% set r = range(100000)|list %}{% for a in r %}{% for b in r %}{% endfor %}{% endfor %}"
    ),
    "a macro that calls itself": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_hostile_chat_template_fails_generate_in_one_line_within_seconds(
    tiny: TinyModels, tmp_path: Path, kind: str
) -> None:
    pair = load_pair(_with(tiny, tmp_path, "hostile", template=HOSTILE[kind]))
    start = time.monotonic()
    with pytest.raises(ModelError, match=r"^the model's chat template is looping") as info:
        list(stream_reply(pair, [Message("user", "Hi")], GenerationParams(max_tokens=2)))
    assert time.monotonic() - start < 5
    assert "\n" not in str(info.value)


@pytest.mark.timeout(60)
def test_tandem_generate_refuses_a_looping_template_in_one_line(
    tiny: TinyModels, tmp_path: Path
) -> None:
    folder = _with(tiny, tmp_path, "hostile", template=HOSTILE["nested loops"])
    r = _tandem_here("generate", "--model", str(folder), "Hi")
    assert r.returncode == 1
    assert r.stderr.strip().startswith("tandem: the model's chat template is looping")
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_template_error_of_any_kind_is_one_line(tiny: TinyModels, tmp_path: Path) -> None:
    pair = load_pair(_with(tiny, tmp_path, "divides", template="{{ 1 / 0 }}"))
    with pytest.raises(ModelError, match=r"^the model's chat template is broken") as info:
        encode_chat(pair.target.tokenizer, [Message("user", "Hi")])
    assert "\n" not in str(info.value)


def test_the_bounded_render_gives_the_ids_transformers_gives(tiny_pair) -> None:
    tokenizer = tiny_pair.target.tokenizer
    messages = [
        Message("system", "Be brief."),
        Message("user", "Say <|im_end|> and\n  spaces, please."),
        Message("assistant", "Sure."),
        Message("user", "Again?"),
    ]
    dicts = [m.as_dict() for m in messages]
    expected = list(tokenizer.apply_chat_template(dicts, add_generation_prompt=True))
    assert encode_chat(tokenizer, messages) == expected
