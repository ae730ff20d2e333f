"""A corpus of broken model folders and GGUF files, built by the tests from the tiny models.

Every entry is made from a good model (see :class:`Sources`) by one change and
says what each user-facing path must answer for it: the library's problem, the
loader's error, the pair check's refusal. A few are fine alone but cannot draft
for the good target, and a few are odd but usable. ``tests/test_bad_inputs.py``
drives every entry through every path.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from tests.fakes import _garbage_header, _truncated_data, _truncated_header

# For Entry.load and Entry.check: the message is the library's.
SAME = "<same as the library>"


@dataclass(frozen=True)
class Sources:
    """The good models entries are made from."""

    target: Path  # the tiny llama that every draft is checked against
    draft: Path  # a good draft for it: its tokenizer, under a quarter of its size
    foreign: Path  # a model with another tokenizer and vocabulary size


Make = Callable[[Path, Sources], Path]


@dataclass(frozen=True)
class Entry:
    """One broken model and what every path says about it.

    Attributes:
        id: Short name; the entry is made at a path of this name.
        make: Builds the entry at the path it is given and returns the path to open.
        library: Part of :func:`inspect_model`'s problem; ``None``: listed as usable.
        load: Part of :func:`load_model`'s error; ``None``: it loads.
        check: Part of ``check-pair``'s one-line error (exit 1) with the entry as the
            draft of the good target; ``None``: the pair check reads it.
        pair: Part of the refusal of the entry as the good target's draft (exit 2 in
            ``check-pair``, :class:`IncompatiblePairError` from ``load_pair``).
    """

    id: str
    make: Make
    library: str | None
    load: str | None = SAME
    check: str | None = SAME
    pair: str | None = None

    @property
    def load_error(self) -> str | None:
        return self.library if self.load == SAME else self.load

    @property
    def check_error(self) -> str | None:
        return self.library if self.check == SAME else self.check

    @property
    def broken(self) -> bool:
        """Whether it cannot be used at all, not even alone."""
        return self.load_error is not None


# --- folder entries ---------------------------------------------------------------


def _copy(dest: Path, src: Sources) -> Path:
    return Path(shutil.copytree(src.draft, dest))


def _mutated(change: Callable[[Path], object]) -> Make:
    def make(dest: Path, src: Sources) -> Path:
        folder = _copy(dest, src)
        change(folder)
        return folder

    return make


def _write(name: str, data: bytes | str) -> Callable[[Path], object]:
    def change(folder: Path) -> None:
        file = folder / name
        if isinstance(data, str):
            file.write_text(data, encoding="utf-8")
        else:
            file.write_bytes(data)

    return change


def _edit_config(**changes: Any) -> Callable[[Path], object]:
    def change(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        for key, value in changes.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        (folder / "config.json").write_text(json.dumps(config))

    return change


def _edit_weights(change: Callable[[dict[str, mx.array]], object]) -> Callable[[Path], object]:
    def edit(folder: Path) -> None:
        file = folder / "model.safetensors"
        weights = mx.load(str(file))
        assert isinstance(weights, dict)
        change(weights)
        mx.save_safetensors(str(file), weights, metadata={"format": "mlx"})

    return edit


def _replace_with_folder(name: str) -> Callable[[Path], object]:
    def change(folder: Path) -> None:
        (folder / name).unlink()
        (folder / name).mkdir()

    return change


def _looping_link(name: str) -> Callable[[Path], object]:
    def change(folder: Path) -> None:
        (folder / name).unlink(missing_ok=True)
        (folder / name).symlink_to(name)  # a link to itself

    return change


def _missing(dest: Path, _src: Sources) -> Path:
    return dest


def _file(dest: Path, src: Sources) -> Path:
    dest.write_bytes((src.draft / "model.safetensors").read_bytes())
    return dest


def _folder_loop(dest: Path, _src: Sources) -> Path:
    dest.symlink_to(dest.name)
    return dest


def _dangling_folder(dest: Path, _src: Sources) -> Path:
    dest.symlink_to(dest.parent / "nowhere")
    return dest


def _unknown_home(_dest: Path, _src: Sources) -> Path:
    # A shell leaves "~user" as it is when there is no such user.
    return Path("~tandem-no-such-user/model")


def _unreadable(dest: Path, src: Sources) -> Path:
    folder = _copy(dest, src)
    folder.chmod(0)  # root reads it all the same: tests/test_bad_inputs.py simulates it then
    return folder


def _below_unreadable(dest: Path, src: Sources) -> Path:
    # Hidden, so the library does not list the locked folder itself.
    locked = dest.with_name(f".{dest.name}")
    model = _copy(locked / "model", src)
    locked.chmod(0)
    return model


def shard(folder: Path) -> dict[str, str]:
    """Splits ``model.safetensors`` into two shards; returns the index's weight map."""
    weights = mx.load(str(folder / "model.safetensors"))
    assert isinstance(weights, dict)
    (folder / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    weight_map: dict[str, str] = {}
    for name, keys in shards.items():
        mx.save_safetensors(str(folder / name), {k: weights[k] for k in keys})
        weight_map.update(dict.fromkeys(keys, name))
    return weight_map


def _sharded(drop_second: bool, index: Any = None) -> Callable[[Path], object]:
    """Splits the weights into two shards with an index, then damages the set."""

    def change(folder: Path) -> None:
        weight_map = shard(folder)
        if drop_second:
            (folder / "model-00002-of-00002.safetensors").unlink()
        data = {"weight_map": weight_map} if index is None else index
        text = data if isinstance(data, str) else json.dumps(data)
        (folder / "model.safetensors.index.json").write_text(text)

    return change


def _inner_loops(folder: Path) -> None:
    (folder / "again").symlink_to(".", target_is_directory=True)
    (folder / "up").symlink_to("..", target_is_directory=True)
    (folder / "itself").symlink_to("itself")


def _rename_weights(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "consolidated.safetensors")


def _different_eos(folder: Path) -> None:
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    tok_config["eos_token"] = "<|endoftext|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    _edit_config(eos_token_id=vocab["<|endoftext|>"])(folder)


def _foreign(dest: Path, src: Sources) -> Path:
    return Path(shutil.copytree(src.foreign, dest))


def _smaller_vocabulary(dest: Path, src: Sources) -> Path:
    from app.testing.tiny import build_model, model_config

    config = model_config(
        "llama",
        vocab_size=320,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    return build_model(dest, config, tokenizer_from=src.target, seed=7)


def _nested(depth: int) -> str:
    return '{"model_type": ' + "[" * depth + "]" * depth + "}"


FOLDERS: tuple[Entry, ...] = (
    # Paths that are no model folder at all.
    Entry("missing-path", _missing, "no such folder"),
    Entry("file-not-folder", _file, "not a folder"),
    Entry("folder-is-a-link-loop", _folder_loop, "a broken or looping symbolic link"),
    Entry("folder-link-dangles", _dangling_folder, "a broken or looping symbolic link"),
    Entry("unknown-home-folder", _unknown_home, "no such folder"),
    Entry("unreadable-folder", _unreadable, "cannot read config.json (permission denied)"),
    Entry("below-an-unreadable-folder", _below_unreadable, "cannot read model (permission denied)"),
    # config.json
    Entry("no-config", _mutated(lambda d: (d / "config.json").unlink()), "no config.json"),
    Entry("empty-config", _mutated(_write("config.json", b"")), "config.json is unreadable"),
    Entry("invalid-json", _mutated(_write("config.json", "{")), "config.json is unreadable"),
    Entry(
        "config-is-a-list",
        _mutated(_write("config.json", "[1, 2]")),
        "config.json is not a JSON object",
    ),
    Entry(
        "config-not-utf8",
        _mutated(_write("config.json", b'{"model_type": "llama\xff\xfe"}')),
        "config.json is unreadable ('utf-8' codec can't decode",
    ),
    Entry(
        "config-nested-too-deep",
        _mutated(_write("config.json", _nested(100_000))),
        "config.json is unreadable",
    ),
    Entry(
        "config-is-a-folder",
        _mutated(_replace_with_folder("config.json")),
        "config.json is a folder, not a file",
    ),
    Entry(
        "config-is-a-link-loop",
        _mutated(_looping_link("config.json")),
        "config.json is a broken or looping symbolic link",
    ),
    Entry(
        "unknown-model-type",
        _mutated(_edit_config(model_type="nope")),
        "architecture 'nope' is not supported",
    ),
    Entry(
        "model-type-names-no-model",
        _mutated(_edit_config(model_type="cache")),  # an mlx_lm.models module, not a model
        "architecture 'cache' is not supported",
    ),
    Entry(
        "model-type-not-a-string",
        _mutated(_edit_config(model_type=42)),
        "config.json names no model_type",
    ),
    Entry(
        "missing-model-type",
        _mutated(_edit_config(model_type=None)),
        "config.json names no model_type",
    ),
    Entry(
        "custom-model-code",
        _mutated(_edit_config(model_file="modeling.py")),
        "the model needs a custom module (modeling.py)",
    ),
    Entry(
        "absurd-layer-count",
        _mutated(_edit_config(num_hidden_layers=100_000)),
        "config.json gives an implausible num_hidden_layers (100000)",
    ),
    Entry(
        "config-lacks-a-size",
        _mutated(_edit_config(hidden_size=None)),
        "config.json does not describe a 'llama' model",
    ),
    Entry(
        "config-size-is-text",
        _mutated(_edit_config(intermediate_size="big")),
        "config.json does not describe a 'llama' model",
    ),
    # Weights
    Entry(
        "no-weights",
        _mutated(lambda d: (d / "model.safetensors").unlink()),
        "no .safetensors weights",
    ),
    Entry(
        "weights-misnamed",
        _mutated(_rename_weights),
        "no .safetensors weights (mlx-lm loads model*.safetensors, not consolidated.safetensors)",
    ),
    Entry(
        "empty-weights",
        _mutated(_write("model.safetensors", b"")),
        "model.safetensors is truncated (no header)",
    ),
    Entry(
        "truncated-header",
        _mutated(_truncated_header),
        "model.safetensors is truncated (header of 5000 bytes",
    ),
    Entry("truncated-data", _mutated(_truncated_data), "model.safetensors is truncated ("),
    Entry(
        "garbage-header",
        _mutated(_garbage_header),
        "model.safetensors has an unreadable header",
    ),
    Entry(
        "header-length-is-garbage",
        _mutated(_write("model.safetensors", b"\xff" * 64)),
        "model.safetensors is not a safetensors file",
    ),
    Entry(
        "weights-are-a-folder",
        _mutated(_replace_with_folder("model.safetensors")),
        "model.safetensors is a folder, not a file",
    ),
    Entry(
        "weights-are-a-link-loop",
        _mutated(_looping_link("model.safetensors")),
        "model.safetensors is a broken or looping symbolic link",
    ),
    Entry(
        "wrong-shape",
        _mutated(_edit_weights(lambda w: w.update({"model.norm.weight": mx.ones((31,))}))),
        "the weights do not match config.json (Expected shape (32,) but received shape (31,) "
        "for parameter model.norm.weight)",
    ),
    Entry(
        "missing-tensor",
        _mutated(_edit_weights(lambda w: w.pop("model.norm.weight"))),
        "the weights do not match config.json (Missing 1 parameters: model.norm.weight.)",
    ),
    Entry(
        "extra-tensor",
        _mutated(_edit_weights(lambda w: w.update({"model.extra.weight": mx.ones((4,))}))),
        "the weights do not match config.json (Received 1 parameters not in model: "
        "model.extra.weight.)",
    ),
    Entry(
        "config-disagrees-with-weights",
        _mutated(_edit_config(intermediate_size=96)),
        "the weights do not match config.json (Expected shape (96, 32) but received",
    ),
    Entry(
        "index-names-a-missing-shard",
        _mutated(_sharded(drop_second=True)),
        "weight shard model-00002-of-00002.safetensors is missing",
    ),
    Entry(
        "index-is-garbage",
        _mutated(_sharded(drop_second=False, index="{")),
        "model.safetensors.index.json is unreadable",
    ),
    Entry(
        "index-without-weight-map",
        _mutated(_sharded(drop_second=False, index=["model-00001-of-00002.safetensors"])),
        "model.safetensors.index.json is not a JSON object",
    ),
    Entry(
        "index-of-a-huge-model",
        _mutated(
            _sharded(
                drop_second=False,
                index={
                    "weight_map": {
                        f"t{i}": f"model-{i % 5000:05d}-of-05000.safetensors"
                        for i in range(200_000)
                    }
                },
            )
        ),
        "weight shard model-00000-of-05000.safetensors is missing",
    ),
    Entry(
        "index-leaves-the-folder",
        _mutated(_sharded(drop_second=False, index={"weight_map": {"a": "../model.safetensors"}})),
        "model.safetensors.index.json names a shard outside the folder",
    ),
    # Tokenizer
    Entry("no-tokenizer", _mutated(lambda d: (d / "tokenizer.json").unlink()), "no tokenizer"),
    Entry(
        "empty-tokenizer",
        _mutated(_write("tokenizer.json", b"")),
        "tokenizer.json is empty",
    ),
    Entry(
        "truncated-tokenizer",
        _mutated(lambda d: _write("tokenizer.json", (d / "tokenizer.json").read_bytes()[:500])(d)),
        "tokenizer.json is truncated or not JSON",
    ),
    Entry(
        "tokenizer-of-no-known-kind",
        _mutated(_write("tokenizer.json", "{}")),
        None,  # only parsing it tells; the library does not, for speed
        load="cannot load",
        check="cannot read the tokenizer",
    ),
    Entry(
        "broken-tokenizer-config",
        _mutated(_write("tokenizer_config.json", "[")),
        "tokenizer_config.json is unreadable",
    ),
    Entry(
        "broken-generation-config",
        _mutated(_write("generation_config.json", "{")),
        "generation_config.json is unreadable",
    ),
    # Fine alone, but not as the good target's draft.
    Entry(
        "tokenizer-of-another-model",
        _foreign,
        None,
        load=None,
        check=None,
        pair="vocabulary sizes differ (384 vs 320)",
    ),
    Entry(
        "different-eos",
        _mutated(_different_eos),
        None,
        load=None,
        check=None,
        pair="end-of-sequence tokens differ",
    ),
    Entry(
        "smaller-vocabulary",
        _smaller_vocabulary,
        None,
        load=None,
        check=None,
        pair="vocabulary sizes differ (384 vs 320)",
    ),
    # Odd but usable: nothing may hang or fail on them.
    Entry("link-loops-inside", _mutated(_inner_loops), None, load=None, check=None),
    Entry(
        "remapped-model-type",  # mlx-lm loads mistral with its llama module
        _mutated(_edit_config(model_type="mistral")),
        None,
        load=None,
        check=None,
    ),
)


# --- GGUF entries -----------------------------------------------------------------


@dataclass(frozen=True)
class GgufEntry:
    """A broken GGUF file and part of the one-line error its import gives."""

    id: str
    make: Callable[[Path, Path], Path]  # (dest, the good model folder) -> the file to import
    error: str


def _gguf(
    arch: str | None = None,
    drop: str | None = None,
    reshape: tuple[str, tuple[int, ...]] | None = None,
    extra: bool = False,
    tokenizer: bool = True,
    int_norm: bool = False,
    config_changes: dict[str, Any] | None = None,
) -> Callable[[Path, Path], Path]:
    def make(dest: Path, good: Path) -> Path:
        from tests.fakes import Q, tiny_tokenizer, weights_of, write_gguf

        config = {**json.loads((good / "config.json").read_text()), **(config_changes or {})}
        weights = weights_of(good)
        if drop:
            del weights[drop]
        if reshape:
            name, shape = reshape
            weights[name] = np.resize(weights[name], shape)
        return write_gguf(
            dest,
            config,
            weights,
            tiny_tokenizer(good) if tokenizer else (lambda _w: None),
            arch=arch,
            qtype=(lambda n, _x: Q.I32 if int_norm and n == "model.norm.weight" else Q.F32),
            extra={"blk.0.mystery.weight": np.ones(4, np.float32)} if extra else None,
        )

    return make


def _cut(keep: float | int) -> Callable[[Path, Path], Path]:
    def make(dest: Path, good: Path) -> Path:
        data = _gguf()(dest, good).read_bytes()
        dest.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
        return dest

    return make


def _bytes(data: bytes) -> Callable[[Path, Path], Path]:
    def make(dest: Path, _good: Path) -> Path:
        dest.write_bytes(data)
        return dest

    return make


def _gguf_folder(dest: Path, _good: Path) -> Path:
    dest.mkdir()
    return dest


def _gguf_loop(dest: Path, _good: Path) -> Path:
    dest.symlink_to(dest.name)
    return dest


GGUFS: tuple[GgufEntry, ...] = (
    GgufEntry("unsupported-tensor-type", _gguf(int_norm=True), "tensor type I32"),
    GgufEntry("unsupported-architecture", _gguf(arch="rwkv6"), "architecture 'rwkv6'"),
    GgufEntry("truncated", _cut(0.5), "not a readable GGUF file, or truncated"),
    GgufEntry("truncated-header", _cut(64), "not a readable GGUF file, or truncated"),
    GgufEntry("empty", _bytes(b""), "not a readable GGUF file, or truncated"),
    GgufEntry("not-gguf", _bytes(b"PK\x03\x04" + os.urandom(4096)), "not a readable GGUF file"),
    GgufEntry("no-tokenizer", _gguf(tokenizer=False), "no tokenizer in the file"),
    GgufEntry(
        "missing-tensor",
        _gguf(drop="model.layers.0.self_attn.q_proj.weight"),
        "the tensors do not make a llama model (Missing 1 parameters: "
        "model.layers.0.self_attn.q_proj.weight.)",
    ),
    GgufEntry(
        "wrong-shape",
        _gguf(reshape=("model.layers.0.mlp.up_proj.weight", (128, 32))),
        "the tensors do not make a llama model (Expected shape (128, 64) but received shape "
        "(128, 32) for parameter model.layers.0.mlp.up_proj.weight)",
    ),
    GgufEntry("unknown-tensor", _gguf(extra=True), "tensor 'blk.0.mystery.weight' has no MLX"),
    GgufEntry(
        "absurd-block-count",
        _gguf(config_changes={"num_hidden_layers": 100_000}),
        "the file's metadata gives an implausible num_hidden_layers (100000)",
    ),
    GgufEntry("a-folder", _gguf_folder, "a-folder.gguf: a folder, not a GGUF file"),
    GgufEntry("a-link-loop", _gguf_loop, "a-link-loop.gguf: a broken or looping symbolic link"),
    GgufEntry("missing", lambda dest, _good: dest, "missing.gguf: no such file"),
)
