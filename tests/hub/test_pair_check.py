from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.errors import ModelError
from app.hub import Verdict, check_pair, format_verdict
from app.testing.tiny import build_model, model_config
from tests.conftest import TinyModels
from tests.fakes import make_cache_repo

CHECKS = [
    "vocabulary size",
    "token texts",
    "special tokens",
    "added tokens",
    "cache rewind",
    "draft size",
    "chat template",
]


def _copy(src: Path, dst: Path) -> Path:
    return Path(shutil.copytree(src, dst))


def _edit_json(file: Path, **changes: object) -> None:
    data = json.loads(file.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    file.write_text(json.dumps(data))


def _failed(verdict: Verdict) -> dict[str, str]:
    return {c.name: c.detail for c in verdict.checks if not c.ok}


def test_compatible_pair(tiny: TinyModels, small_draft: Path) -> None:
    verdict = check_pair(tiny.target, small_draft)

    assert verdict.compatible, verdict.reasons
    assert verdict.reasons == ()
    assert [c.name for c in verdict.checks] == CHECKS
    assert (verdict.target.name, verdict.draft.name) == ("tiny-llama", "tiny-small")
    detail = {c.name: c.detail for c in verdict.checks}
    assert detail["vocabulary size"] == "both 384"
    assert detail["token texts"] == "all 384 token ids match"
    text = format_verdict(verdict)
    assert text.splitlines()[0] == "compatible"
    assert text.count("✓") == len(CHECKS) and "✗" not in text


def test_foreign_tokenizer(tiny: TinyModels, small_draft: Path) -> None:
    verdict = check_pair(small_draft, tiny.foreign)

    failed = _failed(verdict)
    assert not verdict.compatible
    assert failed["vocabulary size"] == "vocabulary sizes differ (384 vs 320)"
    assert "token ids differ; the first is id" in failed["token texts"]
    assert "token texts" in failed and failed["token texts"] in verdict.reasons


def test_differing_eos(tmp_path: Path, tiny: TinyModels, small_draft: Path) -> None:
    draft = _copy(small_draft, tmp_path / "eos")
    vocab = json.loads((draft / "tokenizer.json").read_text())["model"]["vocab"]
    _edit_json(draft / "tokenizer_config.json", eos_token="<|endoftext|>")
    _edit_json(draft / "config.json", eos_token_id=vocab["<|endoftext|>"])

    verdict = check_pair(tiny.target, draft)

    assert _failed(verdict) == {
        "special tokens": "end-of-sequence tokens differ ('<|im_end|>' vs '<|endoftext|>')"
    }


def test_differing_added_tokens(tmp_path: Path, tiny: TinyModels, small_draft: Path) -> None:
    from tokenizers import Tokenizer

    draft = _copy(small_draft, tmp_path / "added")
    tok = Tokenizer.from_file(str(draft / "tokenizer.json"))
    tok.add_special_tokens(["<|tool|>"])
    tok.save(str(draft / "tokenizer.json"))

    failed = _failed(check_pair(tiny.target, draft))

    assert failed["added tokens"] == "added tokens differ: only the draft has '<|tool|>'"
    assert failed["token texts"] == (
        "1 of 385 token ids differ; the first is id 384: (none) vs '<|tool|>'"
    )


def test_a_draft_as_large_as_the_target_is_only_a_warning(tiny: TinyModels) -> None:
    # Size never refuses: a same-size draft (a quantized copy, say) is still exact.
    verdict = check_pair(tiny.target, tiny.copy)

    assert verdict.compatible
    assert list(_failed(verdict)) == ["draft size"]
    assert verdict.warnings == (
        "the draft is 100% of the target (123.2 K vs 123.2 K parameters); under 25% speeds up more",
    )


def test_draft_between_a_quarter_and_half_is_a_warning(tiny: TinyModels, tmp_path: Path) -> None:
    config = model_config("llama", hidden_size=48, num_hidden_layers=1, intermediate_size=96)
    draft = build_model(tmp_path / "mid", config, tokenizer_from=tiny.target, seed=8)
    verdict = check_pair(tiny.target, draft)

    assert verdict.compatible
    assert verdict.reasons == ()
    assert len(verdict.warnings) == 1
    assert "under 25% speeds up more" in verdict.warnings[0]
    text = format_verdict(verdict)
    assert text.startswith("compatible (warning: the draft is ")
    assert "  ! draft size:" in text


def test_missing_chat_template(tmp_path: Path, tiny: TinyModels, small_draft: Path) -> None:
    draft = _copy(small_draft, tmp_path / "plain")
    _edit_json(draft / "tokenizer_config.json", chat_template=None)

    verdict = check_pair(tiny.target, draft)

    assert _failed(verdict) == {"chat template": "the draft has no chat template"}
    lines = format_verdict(verdict).splitlines()
    assert (
        lines[0]
        == "incompatible: plain cannot draft for tiny-llama: the draft has no chat template"
    )
    assert "  ✗ chat template: the draft has no chat template" in lines
    assert len(lines) == 1 + len(CHECKS)


def test_a_draft_whose_cache_cannot_go_back_is_refused(
    tmp_path: Path, tiny: TinyModels, small_draft: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine import recurrent
    from tests.engine.families import hybrid_config

    draft = _copy(small_draft, tmp_path / "tiny-hybrid")
    eos = json.loads((small_draft / "config.json").read_text())["eos_token_id"]
    # Weights of its own: the library refuses a config its weights do not fit.
    config = {**hybrid_config("qwen3_5"), "eos_token_id": eos}
    build_model(draft, config, tokenizer_from=small_draft, seed=5)
    # Every family mlx-lm ships goes back; one it adds later would not be known to.
    monkeypatch.setattr(recurrent, "REWOUND", recurrent.REWOUND - {"qwen3_5"})

    failed = _failed(check_pair(tiny.target, draft))

    assert failed["cache rewind"] == (
        "the draft (tiny-hybrid) cannot rewind its cache: "
        "its recurrent layers (qwen3_5) keep a state that cannot be given back"
    )


def test_broken_folder_raises(tmp_path: Path, tiny: TinyModels, small_draft: Path) -> None:
    draft = _copy(small_draft, tmp_path / "broken")
    (draft / "config.json").unlink()

    with pytest.raises(ModelError, match=r"^broken: no config\.json"):
        check_pair(tiny.target, draft)
    with pytest.raises(ModelError, match="no such folder"):
        check_pair(tmp_path / "absent", small_draft)


def test_unreadable_tokenizer_raises(tmp_path: Path, tiny: TinyModels, small_draft: Path) -> None:
    draft = _copy(small_draft, tmp_path / "badtok")
    (draft / "tokenizer.json").write_text("{}")

    with pytest.raises(ModelError, match="badtok: cannot read the tokenizer"):
        check_pair(tiny.target, draft)


def test_cache_snapshot_is_named_by_repo(
    tmp_path: Path, tiny: TinyModels, small_draft: Path
) -> None:
    snapshot = make_cache_repo(tmp_path / "hub", "org/tiny-small", small_draft)

    verdict = check_pair(tiny.target, snapshot)

    assert verdict.compatible, verdict.reasons
    assert (verdict.draft.name, verdict.draft.repo_id) == ("org/tiny-small", "org/tiny-small")
    assert verdict.draft.source == "hf-cache"


def _sentencepiece_folder(folder: Path, weights_from: Path, sp_model: Path) -> Path:
    """A model whose only tokenizer is a SentencePiece ``tokenizer.model``."""
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(weights_from / name, folder)
    shutil.copy(sp_model, folder / "tokenizer.model")
    tok_config = {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "chat_template": "{{ messages }}",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    _edit_json(folder / "config.json", eos_token_id=2)
    return folder


def test_sentencepiece_fallback(tmp_path: Path, tiny: TinyModels, small_draft: Path) -> None:
    spm = pytest.importorskip("sentencepiece")
    pytest.importorskip("transformers")
    lines = ("The quick brown fox jumps over the lazy dog", "Hello world, how are you")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines * 20),
        model_prefix=str(tmp_path / "sp"),
        vocab_size=48,
        model_type="bpe",
        minloglevel=2,
    )
    sp_model = tmp_path / "sp.model"
    target = _sentencepiece_folder(tmp_path / "sp-target", tiny.target, sp_model)
    draft = _sentencepiece_folder(tmp_path / "sp-draft", small_draft, sp_model)

    verdict = check_pair(target, draft)

    assert verdict.compatible, verdict.reasons
    detail = {c.name: c.detail for c in verdict.checks}
    assert detail["token texts"] == "all 48 token ids match"
    assert "eos '</s>'" in detail["special tokens"]

    mixed = _failed(check_pair(tiny.target, draft))
    assert "token ids differ" in mixed["token texts"]


def test_padded_embeddings_of_another_size_are_compatible(tiny: TinyModels, tmp_path: Path) -> None:
    config = model_config(
        "llama",
        vocab_size=400,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    config["tie_word_embeddings"] = True
    padded = build_model(tmp_path / "padded", config, tokenizer_from=tiny.target, seed=6)
    verdict = check_pair(tiny.target, padded)
    assert verdict.compatible, verdict.reasons
    size = next(c for c in verdict.checks if c.name == "vocabulary size")
    assert size.detail == "384 vs 400 rows, padding past the 384 tokens they share"
