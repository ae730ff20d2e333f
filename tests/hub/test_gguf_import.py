"""GGUF import: tiny models written as GGUF files the way llama.cpp's converter does."""

from __future__ import annotations

import errno
import json
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gguf
import mlx.core as mx
import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import ByteLevel

from app.engine.generate import stream_reply
from app.engine.loader import ModelPair, load_model
from app.engine.types import DraftSetting, Finished, GenerationParams, Message
from app.errors import ModelError
from app.hub.gguf_import import ImportCancelled, ImportProgress, convert, import_folder, import_gguf
from app.hub.gguf_import import shards as shard_writer
from app.testing.tiny import CHATML_TEMPLATE, build_model, model_config
from tests.fakes import Q, TokenizerMeta, permute, tiny_tokenizer, weights_of, write_gguf

_SAMPLES = ("Hello, world!", "café naïve résumé", "emoji 🙂🚀 done", "<|im_end|>", "a<|im_start|>b")
_PROMPT = [Message("user", "Write a haiku about the sea.")]

# A SentencePiece vocabulary: special tokens, the 256 byte tokens, then pieces whose
# merges lead to "hello" and "world" whatever order they are applied in.
_SPM_SPECIAL = [("<unk>", 2), ("<bos>", 3), ("<eos>", 3), ("<end_of_turn>", 3)]
_SPM_PIECES = ["\u2581", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "llo", "hello"]
_SPM_PIECES += ["\u2581hello", "wo", "rl", "rld", "world", "\u2581world"]
_SPM_TOKENS = [t for t, _ in _SPM_SPECIAL] + [f"<0x{b:02X}>" for b in range(256)] + _SPM_PIECES


def spm_tokenizer(*, add_space_prefix: bool) -> TokenizerMeta:
    def add(w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("llama")
        w.add_token_list(_SPM_TOKENS)
        types = [t for _, t in _SPM_SPECIAL] + [6] * 256 + [1] * len(_SPM_PIECES)
        w.add_token_types(types)
        w.add_token_scores([0.0] * (len(_SPM_SPECIAL) + 256) + [float(len(p)) for p in _SPM_PIECES])
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
        w.add_add_space_prefix(add_space_prefix)

    return add


def greedy(folder: Path) -> tuple[int, ...]:
    pair = ModelPair(load_model(folder))
    params = GenerationParams(max_tokens=16, drafting=DraftSetting.of(0))
    finished = list(stream_reply(pair, _PROMPT, params))[-1]
    assert isinstance(finished, Finished)
    return finished.token_ids


def leftovers(out_dir: Path) -> list[Path]:
    return [out_dir] * out_dir.exists() + sorted(out_dir.parent.glob(f".{out_dir.name}.*"))


def random_weights(config: dict[str, Any], *, seed: int) -> dict[str, np.ndarray]:
    """Hugging Face weights for ``config``, built by mlx-lm's own model class."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    # Norms start at 0 (Gemma) or 1; vary them so a wrong shift or mapping shows.
    rng = np.random.default_rng(seed)
    return {
        k: np.array(v) * 4 if v.ndim == 2 else np.array(v) + rng.normal(0, 0.1, v.shape)
        for k, v in params.items()
    }


def reference_folder(
    folder: Path, config: dict[str, Any], weights: dict[str, np.ndarray], tokenizer_from: Path
) -> Path:
    """The same weights saved directly in the Hugging Face layout, for comparison."""
    folder.mkdir()
    mx.save_safetensors(
        str(folder / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()}
    )
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, folder / name)
    return folder


@dataclass(frozen=True)
class Tiny:
    llama: Path
    qwen2: Path
    llama_gguf: Path
    qwen2_gguf: Path
    llama_imported: Path
    progress: tuple[ImportProgress, ...]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    root = tmp_path_factory.mktemp("gguf")
    llama = build_model(root / "llama", model_config("llama"), seed=0)
    qwen2_config = model_config("qwen2")
    qwen2_config["tie_word_embeddings"] = True
    qwen2 = build_model(root / "qwen2", qwen2_config, tokenizer_from=llama, seed=1)
    files = {}
    for folder in (llama, qwen2):
        config = json.loads((folder / "config.json").read_text())
        files[folder.name] = write_gguf(
            root / f"{folder.name}.gguf", config, weights_of(folder), tiny_tokenizer(llama)
        )
    events: list[ImportProgress] = []
    imported = import_gguf(files["llama"], root / "llama-imported", progress=events.append)
    return Tiny(llama, qwen2, files["llama"], files["qwen2"], imported, tuple(events))


def test_unpermute_inverts_llama_cpp_permute() -> None:
    rng = np.random.default_rng(0)
    for n_head, n_kv in ((4, 4), (4, 2), (8, 1)):
        head_dim = 16
        q = rng.normal(size=(n_head * head_dim, 24)).astype(np.float32)
        k = rng.normal(size=(n_kv * head_dim, 24)).astype(np.float32)
        bias = rng.normal(size=(n_kv * head_dim,)).astype(np.float32)
        assert not np.array_equal(permute(q, n_head, n_head), q)
        np.testing.assert_array_equal(convert._unpermute_qk(permute(q, n_head, n_head), n_head), q)
        np.testing.assert_array_equal(convert._unpermute_qk(permute(k, n_head, n_kv), n_kv), k)
        np.testing.assert_array_equal(
            convert._unpermute_qk(permute(bias, n_head, n_kv), n_kv), bias
        )


def test_llama_f32_is_exact(tiny_gguf: Tiny) -> None:
    out = tiny_gguf.llama_imported
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["vocab_size"] == 384
    assert config["tie_word_embeddings"] is False
    assert config["rms_norm_eps"] == 1e-5
    original, imported = weights_of(tiny_gguf.llama), weights_of(out)
    assert original.keys() == imported.keys()
    for name, value in original.items():
        np.testing.assert_array_equal(imported[name], value, err_msg=name)
    reference = greedy(tiny_gguf.llama)
    assert len(reference) > 4
    assert greedy(out) == reference
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2


def test_progress_is_reported_per_tensor(tiny_gguf: Tiny) -> None:
    events = tiny_gguf.progress
    stages = list(dict.fromkeys(e.stage for e in events))
    assert stages == ["reading", "tokenizer", "tensors", "writing"]
    tensors = [e for e in events if e.stage == "tensors"]
    n = len(weights_of(tiny_gguf.llama))
    assert [e.done for e in tensors] == list(range(n + 1))
    assert all(e.total == n for e in tensors)


def test_qwen2_tied_f32_is_exact(tiny_gguf: Tiny, tmp_path: Path) -> None:
    out = import_gguf(tiny_gguf.qwen2_gguf, tmp_path / "qwen2")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["tie_word_embeddings"] is True
    original, imported = weights_of(tiny_gguf.qwen2), weights_of(out)
    assert "lm_head.weight" not in imported
    assert original.keys() == imported.keys()
    for name, value in original.items():
        np.testing.assert_array_equal(imported[name], value, err_msg=name)
    assert greedy(out) == greedy(tiny_gguf.qwen2)


def test_tokenizer_and_chat_template_survive(tiny_gguf: Tiny) -> None:
    original = load_model(tiny_gguf.llama).tokenizer
    imported = load_model(tiny_gguf.llama_imported).tokenizer
    for text in _SAMPLES:
        assert imported.encode(text) == original.encode(text), text
        ids = original.encode(text)
        assert imported.decode(ids) == original.decode(ids)
    assert imported.encode("<|im_end|>") == [2]
    assert imported.chat_template == CHATML_TEMPLATE
    messages = [m.as_dict() for m in _PROMPT]
    assert imported.apply_chat_template(
        messages, add_generation_prompt=True
    ) == original.apply_chat_template(messages, add_generation_prompt=True)
    assert set(imported.eos_token_ids) == set(original.eos_token_ids)
    assert imported.get_vocab() == original.get_vocab()


def test_f16_and_q8_0_tensors_dequantize(tiny_gguf: Tiny, tmp_path: Path) -> None:
    config = json.loads((tiny_gguf.llama / "config.json").read_text())
    original = weights_of(tiny_gguf.llama)

    def kind(name: str, x: np.ndarray) -> Any:
        return Q.Q8_0 if x.ndim == 2 and "mlp" not in name else Q.F16

    gguf_file = write_gguf(
        tmp_path / "mixed.gguf", config, original, tiny_tokenizer(tiny_gguf.llama), qtype=kind
    )
    reader = gguf.GGUFReader(gguf_file)
    assert {t.tensor_type for t in reader.tensors} == {Q.F16, Q.Q8_0}
    del reader
    out = import_gguf(gguf_file, tmp_path / "mixed")
    imported = weights_of(out)
    for name, value in original.items():
        # Q8_0 keeps 8 bits per value with one scale per 32; F16 keeps 11 bits.
        tolerance = np.abs(value).max() / 100 if value.ndim == 2 else 1e-2
        np.testing.assert_allclose(imported[name], value, atol=tolerance, err_msg=name)
    assert len(greedy(out)) > 0


def test_q_bits_8_quantizes_with_mlx(tiny_gguf: Tiny, tmp_path: Path) -> None:
    events: list[ImportProgress] = []
    out = import_gguf(tiny_gguf.llama_gguf, tmp_path / "q8", q_bits=8, progress=events.append)
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["bits"] == 8
    assert config["quantization"]["group_size"] == 64
    weights = weights_of(out)
    assert weights["model.layers.0.self_attn.q_proj.weight"].dtype == np.uint32
    assert "model.layers.0.self_attn.q_proj.scales" in weights
    assert not (out / ".unquantized").exists()
    assert "quantizing" in {e.stage for e in events}
    assert len(greedy(out)) > 0


def test_large_models_are_sharded(
    tiny_gguf: Tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard_writer, "_SHARD_BYTES", 40_000)
    out = import_gguf(tiny_gguf.llama_gguf, tmp_path / "sharded")
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 2
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert greedy(out) == greedy(tiny_gguf.llama)


def test_cancel_leaves_nothing(tiny_gguf: Tiny, tmp_path: Path) -> None:
    cancel = threading.Event()

    def progress(p: ImportProgress) -> None:
        if p.stage == "tensors" and p.done == 3:
            cancel.set()

    out = tmp_path / "cancelled"
    with pytest.raises(ImportCancelled):
        import_gguf(tiny_gguf.llama_gguf, out, progress=progress, cancel=cancel)
    assert leftovers(out) == []
    assert list(tmp_path.iterdir()) == []


def test_unsupported_architecture_is_refused(tiny_gguf: Tiny, tmp_path: Path) -> None:
    config = json.loads((tiny_gguf.llama / "config.json").read_text())
    weights = weights_of(tiny_gguf.llama)
    rwkv = write_gguf(
        tmp_path / "rwkv.gguf", config, weights, tiny_tokenizer(tiny_gguf.llama), arch="rwkv6"
    )
    out = tmp_path / "rwkv"
    with pytest.raises(ModelError, match="architecture 'rwkv6' is not supported") as info:
        import_gguf(rwkv, out)
    assert "\n" not in str(info.value)
    assert leftovers(out) == []


@pytest.mark.parametrize("keep", [0.5, 0.002])
def test_truncated_file_is_refused(tiny_gguf: Tiny, tmp_path: Path, keep: float) -> None:
    data = tiny_gguf.llama_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    out = tmp_path / "cut"
    with pytest.raises(ModelError, match=r"cut\.gguf") as info:
        import_gguf(cut, out)
    assert "\n" not in str(info.value)
    assert leftovers(out) == []


@pytest.mark.parametrize(
    ("kind", "refusal"),
    [
        ({"model": "bert"}, "tokenizer type 'bert' is not supported yet"),
        ({"pre": "kimi-k2"}, "pre-tokenizer 'kimi-k2' is not supported yet"),
    ],
    ids=["type", "pre-tokenizer"],
)
def test_an_unsupported_tokenizer_is_refused(
    tiny_gguf: Tiny, tmp_path: Path, kind: dict[str, Any], refusal: str
) -> None:
    config = json.loads((tiny_gguf.llama / "config.json").read_text())
    path = write_gguf(
        tmp_path / "odd.gguf",
        config,
        weights_of(tiny_gguf.llama),
        tiny_tokenizer(tiny_gguf.llama, **kind),
    )
    out = tmp_path / "odd"
    with pytest.raises(ModelError, match=refusal):
        import_gguf(path, out)
    assert leftovers(out) == []


def test_tekken_splits_words_at_capitals_and_adds_bos(tiny_gguf: Tiny, tmp_path: Path) -> None:
    config = json.loads((tiny_gguf.llama / "config.json").read_text())
    tokenizer = tiny_tokenizer(tiny_gguf.llama, pre="tekken", add_bos=None)
    path = write_gguf(tmp_path / "nemo.gguf", config, weights_of(tiny_gguf.llama), tokenizer)
    out = import_gguf(path, tmp_path / "nemo")
    split = Tokenizer.from_file(str(out / "tokenizer.json")).pre_tokenizer
    pieces = [p for p, _ in split.pre_tokenize_str("HelloWorld 2024")]
    assert pieces == ["Hello", "World", "Ġ", "2", "0", "2", "4"]  # Ġ: the space, byte-mapped
    # A Tekken file without tokenizer.ggml.add_bos_token starts prompts with BOS.
    assert json.loads((out / "tokenizer_config.json").read_text())["add_bos_token"] is True


@pytest.mark.parametrize(
    ("pre", "digits"),
    [("deepseek-llm", ["123"]), ("deepseek-coder", ["1", "2", "3"])],
)
def test_deepseek_llm_and_coder_split_as_their_tokenizer_json_does(
    tiny_gguf: Tiny, tmp_path: Path, pre: str, digits: list[str]
) -> None:
    config = json.loads((tiny_gguf.llama / "config.json").read_text())
    tokenizer = tiny_tokenizer(tiny_gguf.llama, pre=pre)
    path = write_gguf(tmp_path / "ds.gguf", config, weights_of(tiny_gguf.llama), tokenizer)
    split = Tokenizer.from_file(str(import_gguf(path, tmp_path / "ds") / "tokenizer.json"))
    pieces = [p for p, _ in split.pre_tokenizer.pre_tokenize_str("Hello, world 123\n\u4e2d\u6587")]
    # Newlines, letters, punctuation, CJK and digits split in turn (as bytes: Ġ, Ċ).
    chinese = ByteLevel(add_prefix_space=False).pre_tokenize_str("\u4e2d\u6587")[0][0]
    assert pieces == ["Hello", ",", "Ġworld", "Ġ", *digits, "Ċ", chinese]


def test_unsupported_tensor_type_is_refused(tiny_gguf: Tiny, tmp_path: Path) -> None:
    config = json.loads((tiny_gguf.llama / "config.json").read_text())

    def kind(name: str, _x: np.ndarray) -> Any:
        return Q.I32 if name == "model.norm.weight" else Q.F32

    ints = write_gguf(
        tmp_path / "i32.gguf",
        config,
        weights_of(tiny_gguf.llama),
        tiny_tokenizer(tiny_gguf.llama),
        qtype=kind,
    )
    out = tmp_path / "i32"
    with pytest.raises(ModelError, match=r"tensor type I32 .* is not supported"):
        import_gguf(ints, out)
    assert leftovers(out) == []


def test_llama3_rope_scaling_is_recovered(tiny_gguf: Tiny, tmp_path: Path) -> None:
    config = json.loads((tiny_gguf.llama / "config.json").read_text())
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    # The factors as convert_hf_to_gguf.py's LlamaModel computes them for rope_freqs.
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / config["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim)
    factors = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < 8192 / 4.0:
            factors.append(1.0)
        elif wavelen > 8192 / 1.0:
            factors.append(8.0)
        else:
            smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
            factors.append(1 / ((1 - smooth) / 8.0 + smooth))
    assert len(set(factors)) > 2  # some in each band and some smoothed
    rope_freqs = {"rope_freqs.weight": np.array(factors, dtype=np.float32)}
    gguf_file = write_gguf(
        tmp_path / "l3.gguf",
        config,
        weights_of(tiny_gguf.llama),
        tiny_tokenizer(tiny_gguf.llama),
        extra=rope_freqs,
    )
    out = import_gguf(gguf_file, tmp_path / "llama3")
    assert json.loads((out / "config.json").read_text())["rope_scaling"] == scaling
    assert "rope_freqs.weight" not in weights_of(out)
    reference = reference_folder(
        tmp_path / "reference",
        {**config, "rope_scaling": scaling},
        weights_of(tiny_gguf.llama),
        out,
    )
    assert greedy(out) == greedy(reference)


def test_existing_out_dir_is_not_overwritten(tiny_gguf: Tiny, tmp_path: Path) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(ModelError, match="already exists"):
        import_gguf(tiny_gguf.llama_gguf, out)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_full_disk_is_reported(
    tiny_gguf: Tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "full"

    def full(_file: Path, _data: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(convert, "_write_json", full)
    with pytest.raises(ModelError, match="not enough disk space"):
        import_gguf(tiny_gguf.llama_gguf, out)
    assert leftovers(out) == []

    monkeypatch.undo()
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: SimpleNamespace(total=1, used=1, free=0))
    with pytest.raises(ModelError, match="not enough disk space"):
        import_gguf(tiny_gguf.llama_gguf, out)
    assert leftovers(out) == []


def test_qwen3_matches_its_hugging_face_weights(tiny_gguf: Tiny, tmp_path: Path) -> None:
    config = model_config("qwen3", num_attention_heads=4, num_key_value_heads=2)
    config.update(head_dim=32, rope_theta=1_000_000.0, eos_token_id=2)
    weights = random_weights(config, seed=3)
    assert "model.layers.0.self_attn.q_norm.weight" in weights
    gguf_file = write_gguf(tmp_path / "q3.gguf", config, weights, tiny_tokenizer(tiny_gguf.llama))
    out = import_gguf(gguf_file, tmp_path / "qwen3")
    imported = json.loads((out / "config.json").read_text())
    assert imported["model_type"] == "qwen3"
    assert imported["head_dim"] == 32
    reference = reference_folder(tmp_path / "reference", config, weights, out)
    assert greedy(out) == greedy(reference)


def test_gemma3_norms_config_and_sentencepiece(tmp_path: Path) -> None:
    config: dict[str, Any] = {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 6,  # mlx-lm's Gemma 3 needs one full sliding-window pattern
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 2048,
        "vocab_size": 288,  # embedding rows past the 278 tokens, as real files pad
        "tie_word_embeddings": True,
    }
    weights = random_weights(config, seed=4)
    del weights["lm_head.weight"]  # tied: mlx-lm's class drops it when loading
    gguf_file = write_gguf(
        tmp_path / "g3.gguf", config, weights, spm_tokenizer(add_space_prefix=False)
    )
    out = import_gguf(gguf_file, tmp_path / "gemma3")
    imported = json.loads((out / "config.json").read_text())
    for key in ("model_type", "head_dim", "query_pre_attn_scalar", "sliding_window", "vocab_size"):
        assert imported[key] == config[key], key
    assert imported["tie_word_embeddings"] is True
    stored = weights_of(out)
    for name, value in weights.items():
        np.testing.assert_allclose(stored[name], value, atol=1e-6, err_msg=name)

    tokenizer = load_model(out).tokenizer
    ids = tokenizer.encode("hello world")
    assert [_SPM_TOKENS[i] for i in ids] == ["<bos>", "hello", "\u2581world"]
    emoji = tokenizer.encode("hello 🙂", add_special_tokens=False)
    assert [_SPM_TOKENS[i] for i in emoji] == [
        "hello",
        "\u2581",
        "<0xF0>",
        "<0x9F>",
        "<0x99>",
        "<0x82>",
    ]
    assert tokenizer.decode(emoji) == "hello 🙂"
    assert tokenizer.encode("<end_of_turn>", add_special_tokens=False) == [3]

    reference = reference_folder(tmp_path / "reference", config, weights, out)
    assert greedy(out) == greedy(reference)


def test_sentencepiece_with_space_prefix(tmp_path: Path) -> None:
    config = model_config("llama", vocab_size=len(_SPM_TOKENS), hidden_size=32)
    weights = random_weights(config, seed=5)
    gguf_file = write_gguf(
        tmp_path / "spm.gguf", config, weights, spm_tokenizer(add_space_prefix=True)
    )
    out = import_gguf(gguf_file, tmp_path / "spm")
    tokenizer = load_model(out).tokenizer
    ids = tokenizer.encode("hello world")
    assert [_SPM_TOKENS[i] for i in ids] == ["<bos>", "\u2581hello", "\u2581world"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hello world"
    assert tokenizer.decode(tokenizer.encode("hello 🙂"), skip_special_tokens=True) == "hello 🙂"
    # <end_of_turn> is a control token that ends a turn, so it stops generation too.
    assert tokenizer.eos_token_ids == {2, 3}


def test_import_folder_copies_and_links(tiny_gguf: Tiny, tmp_path: Path) -> None:
    models = tmp_path / "models"
    copied = import_folder(tiny_gguf.llama, models)
    assert copied == models / "llama"
    assert not copied.is_symlink()
    assert sorted(p.name for p in copied.iterdir()) == sorted(
        p.name for p in tiny_gguf.llama.iterdir()
    )
    assert [p.name for p in models.iterdir()] == ["llama"]
    with pytest.raises(ModelError, match="already exists"):
        import_folder(tiny_gguf.llama, models)

    linked = import_folder(tiny_gguf.qwen2, models, link=True)
    assert linked.is_symlink()
    assert linked.resolve() == tiny_gguf.qwen2.resolve()
    assert load_model(linked).config["model_type"] == "qwen2"

    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    with pytest.raises(ModelError, match=r"no config\.json"):
        import_folder(not_a_model, models)
    assert sorted(p.name for p in models.iterdir()) == ["llama", "qwen2"]


def test_import_folder_quantizes_a_folder_of_float_weights(tiny_gguf: Tiny, tmp_path: Path) -> None:
    models = tmp_path / "models"
    src = Path(shutil.copytree(tiny_gguf.llama, tmp_path / "llama"))
    (src / "chat_template.jinja").write_text(CHATML_TEMPLATE)  # a file of its own
    events: list[ImportProgress] = []
    out = import_folder(src, models, q_bits=8, progress=events.append)
    assert out == models / "llama-8bit"
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"] == {"group_size": 64, "bits": 8, "mode": "affine"}
    assert weights_of(out)["model.layers.0.self_attn.q_proj.weight"].dtype == np.uint32
    # Beside the weights, the folder's own files come along as they are.
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (src / name).read_bytes()
    assert "quantizing" in {e.stage for e in events}
    # Quantized as a GGUF file of the same weights is.
    from_gguf = weights_of(import_gguf(tiny_gguf.llama_gguf, tmp_path / "gguf", q_bits=8))
    got = weights_of(out)
    assert got.keys() == from_gguf.keys()
    for key, value in got.items():
        np.testing.assert_array_equal(value, from_gguf[key], err_msg=key)
    assert len(greedy(out)) > 0
    assert [p.name for p in models.iterdir()] == ["llama-8bit"]


def test_import_folder_refuses_to_quantize_quantized_weights(
    tiny_gguf: Tiny, tmp_path: Path
) -> None:
    quantized = import_folder(tiny_gguf.llama, tmp_path / "first", q_bits=4)
    models = tmp_path / "models"
    with pytest.raises(ModelError) as caught:
        import_folder(quantized, models, q_bits=8)
    assert str(caught.value) == "llama-4bit is already quantized (4-bit); import it as it is"
    with pytest.raises(ValueError, match="cannot be quantized"):
        import_folder(tiny_gguf.llama, models, q_bits=4, link=True)
    assert not models.exists() or not any(models.iterdir())
    assert import_folder(quantized, models) == models / "llama-4bit"  # as it is
