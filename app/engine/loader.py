"""Loading model folders and checking that a target and a draft fit together."""

from __future__ import annotations

import contextlib
import json
import logging
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

# Re-exported: callers long imported the user-facing errors from here.
from app.errors import IncompatiblePairError as IncompatiblePairError
from app.errors import ModelError, first_line, one_line
from app.files import is_plain_name, not_regular

_CONTEXT_KEYS = (
    "max_position_embeddings",
    "max_sequence_length",
    "max_seq_len",
    "seq_length",
    "n_positions",
    "n_ctx",
)

# Far past any real checkpoint; a corrupt config beyond them would make building
# the model take minutes or exhaust memory before any weight is looked at.
_CEILINGS = {
    "num_hidden_layers": 1024,
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 20,
    "vocab_size": 1 << 24,
    "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "num_experts": 1 << 12,
    "n_routed_experts": 1 << 12,
}
# An index maps tensor names to files; even the largest models' are a few megabytes.
_MAX_INDEX_BYTES = 100 * 1024 * 1024
# A larger safetensors header is not one but garbage read as a length.
_MAX_HEADER_BYTES = 100 * 1024 * 1024
# Weights are read in groups of about a hundredth of the model, but none smaller
# than this: each group is one evaluation, and one progress report.
_MIN_GROUP_BYTES = 32 * 1024 * 1024
_GROUPS = 100


@dataclass(frozen=True, slots=True)
class LoadProgress:
    """A pair is loading: ``step`` of ``steps`` done, ``text`` says what runs now.

    Attributes:
        step: Steps done (the check of the pair, the target, the draft).
        steps: Steps in all.
        text: What runs now, such as "Loading qwen2.5-7b".
        done: Bytes of the model's weights in memory so far, while they are read.
        total: Bytes of its weights in all; 0 when no weights are read now.
        seconds_left: The rest's estimate at the rate so far; ``None`` until known.
    """

    step: int
    steps: int
    text: str
    done: int = 0
    total: int = 0
    seconds_left: float | None = None

    @property
    def fraction(self) -> float:
        """The share of the whole load done: the steps, and this step's bytes."""
        if self.steps <= 0:
            return 1.0
        part = min(self.done / self.total, 1.0) if self.total > 0 else 0.0
        return (self.step + part) / self.steps


# progress(done, total): bytes of a model's weights in memory so far, of all of them
BytesRead = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """A tensor as a safetensors header describes it."""

    dtype: str
    shape: tuple[int, ...]


def context_length(config: dict[str, Any]) -> int | None:
    """The trained context length a model's config gives, if any."""
    # Multimodal configs keep the language model's settings under text_config.
    text_config = config.get("text_config")
    for section in (config, text_config if isinstance(text_config, dict) else {}):
        for key in _CONTEXT_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


@dataclass(eq=False)
class LoadedModel:
    """A model and its tokenizer, ready to run on the thread that loaded them.

    ``fused`` and ``stamp`` (the weight files' names, sizes and modification
    times when it loaded) say with ``path`` which load it is: another load of
    the same folder may keep this one only while all three still match.
    """

    path: Path
    model: nn.Module
    tokenizer: Any  # mlx_lm.tokenizer_utils.TokenizerWrapper
    config: dict[str, Any]
    fused: bool = False
    stamp: tuple[tuple[str, int, int], ...] = ()

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def context_length(self) -> int | None:
        return context_length(self.config)


@dataclass(eq=False)
class ModelPair:
    """A target model and an optional draft model."""

    target: LoadedModel
    draft: LoadedModel | None = None

    @property
    def label(self) -> str:
        return f"{self.target.name} + {self.draft.name}" if self.draft else self.target.name


def read_config(path: Path) -> dict[str, Any]:
    """Validates a model folder without loading weights and returns its config.

    Checks the folder; ``config.json`` (a JSON object naming an architecture
    mlx-lm has, with plausible sizes and no custom code); the weight files
    mlx-lm loads, their index and their headers; and the tokenizer files. Only
    headers and the small JSON files are read; for the tensors' names and shapes
    see :func:`check_weights`.

    Raises:
        ModelError: With a one-line reason.
    """
    name = path.name or str(path)
    try:
        return _read_config(path, name)
    except OSError as exc:  # permission denied, a vanished disk
        raise ModelError(f"{name}: {read_error(exc)}") from exc


def _read_config(path: Path, name: str) -> dict[str, Any]:
    if not path.exists():
        if path.is_symlink():
            raise ModelError(f"{path}: a broken or looping symbolic link")
        raise ModelError(f"{path}: no such folder")
    if not path.is_dir():
        raise ModelError(f"{path}: not a folder")
    config_file = path / "config.json"
    if not is_model_file(config_file, name):
        raise ModelError(f"{name}: no config.json, so this is not a model folder")
    config = _load_json(config_file, name)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelError(f"{name}: config.json names no model_type")
    if config.get("model_file") is not None:
        # mlx-lm would import it: code from the folder, which Tandem never runs.
        raise ModelError(
            f"{name}: the model needs a custom module ({config['model_file']}), "
            "and Tandem runs no code from a model folder"
        )
    check_sizes(config, name)
    model_classes(config, name)
    for file in weight_files(path):
        read_header(file)
    # mlx-lm and transformers read these too, and fail on what is not a JSON object.
    for extra in ("tokenizer_config.json", "generation_config.json"):
        if is_model_file(path / extra, name):
            _load_json(path / extra, name)
    if is_model_file(path / "tokenizer.json", name):
        _sniff_json(path / "tokenizer.json", name)
    elif not is_model_file(path / "tokenizer.model", name):
        raise ModelError(f"{name}: no tokenizer (tokenizer.json or tokenizer.model)")
    return config


def dequantizes_fp8(config: dict[str, Any]) -> bool:
    """Whether ``config``'s weights are block-scaled fp8 (DeepSeek-V3's, Ministral 3's) that
    mlx-lm's model dequantizes to bfloat16 in its ``sanitize`` as it loads. mlx-lm keeps
    fp8 packed (as mxfp8) only with power-of-two scales over 32 x 32 blocks."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "fp8":
        return False
    blocks = list(quant.get("weight_block_size", ()))
    return not (quant.get("scale_fmt") == "ue8m0" and blocks == [32, 32])


def quantization_of(config: dict[str, Any]) -> str | None:
    """How a model's weights stay quantized once loaded, in a word ("4-bit", "mxfp4");
    ``None`` where they load unquantized, fp8 that mlx-lm dequantizes among them
    (:func:`dequantizes_fp8`), which can therefore be quantized again."""
    quant = config.get("quantization") or config.get("quantization_config")
    if not isinstance(quant, dict) or dequantizes_fp8(config):
        return None
    bits = quant.get("bits")
    if isinstance(bits, int):
        return f"{bits}-bit"
    return str(quant.get("quant_method") or "quantized")


def weight_files(path: Path) -> list[Path]:
    """The safetensors files mlx-lm loads (``model*.safetensors``), checked against any index.

    Raises:
        ModelError: There are none, or the index is damaged or names a missing shard.
    """
    name = path.name or str(path)
    files = [f for f in sorted(path.glob("model*.safetensors")) if is_model_file(f, name)]
    if not files:
        # mlx-lm loads model*.safetensors only; say so when other names are there.
        other = next((f.name for f in sorted(path.glob("*.safetensors")) if f.is_file()), None)
        hint = f" (mlx-lm loads model*.safetensors, not {other})" if other else ""
        raise ModelError(f"{name}: no .safetensors weights{hint}")
    _check_index(path, name)
    return files


def read_header(file: Path) -> dict[str, TensorInfo]:
    """Reads a safetensors header (an 8-byte little-endian length, then JSON) and checks its sizes.

    Returns:
        Every tensor by name.

    Raises:
        ModelError: Named by the model folder and the file, with a one-line reason.
    """
    prefix = f"{file.parent.name}: {file.name}"
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelError(f"{prefix} is truncated (no header)")
        (length,) = struct.unpack("<Q", head)
        if length > _MAX_HEADER_BYTES:
            raise ModelError(f"{prefix} is not a safetensors file")
        if 8 + length > size:
            raise ModelError(f"{prefix} is truncated (header of {length} bytes, file of {size})")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ModelError(f"{prefix} has an unreadable header") from exc
    if not isinstance(header, dict):
        raise ModelError(f"{prefix} has an unreadable header")
    tensors: dict[str, TensorInfo] = {}
    data_end = 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
            tensors[key] = TensorInfo(dtype=str(entry["dtype"]), shape=shape)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"{prefix} has an unreadable header ({key})") from exc
        if begin > end or min(shape, default=0) < 0:
            raise ModelError(f"{prefix} has an unreadable header ({key})")
        data_end = max(data_end, end)
    available = size - 8 - length
    if data_end > available:
        raise ModelError(f"{prefix} is truncated ({available} of {data_end} data bytes)")
    return tensors


def model_classes(config: dict[str, Any], name: str) -> tuple[Any, Any]:
    """The mlx-lm model and argument classes of a config, as mlx-lm's loader picks them.

    Raises:
        ModelError: mlx-lm has no such architecture.
    """
    from mlx_lm.utils import _get_classes

    model_type = config.get("model_type")
    try:
        # mlx-lm remaps some types (mistral is llama) and imports the rest by name.
        return cast(tuple[Any, Any], _get_classes(config))
    except (ValueError, AttributeError) as exc:  # no module, or a module that is no model
        raise ModelError(f"{name}: architecture '{model_type}' is not supported") from exc
    except Exception as exc:  # an odd "architectures" entry, for one
        raise ModelError(f"{name}: config.json is malformed ({first_line(exc)})") from exc


def config_model(config: dict[str, Any]) -> Any:
    """``config``'s mlx-lm model object, its weights never evaluated (only its shape is read).

    Raises:
        Exception: mlx-lm's model classes reject odd configs in many ways.
    """
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    return model_class(args_class.from_dict(config))


def check_weights(path: Path, config: dict[str, Any]) -> None:
    """Checks that the weights are exactly the tensors, of the shapes, the config's model has.

    mlx-lm builds the model and maps the safetensors files lazily, reading only
    their headers and evaluating nothing, so this takes milliseconds even for
    a large model. Call it after :func:`read_config` accepted the folder.

    Raises:
        ModelError: With a one-line reason.
    """
    from mlx_lm.utils import load_model as build_lazily

    name = path.name or str(path)
    model_class, args_class = model_classes(config, name)
    try:
        model_class(args_class.from_dict(config))
    except Exception as exc:  # model classes reject odd configs in many ways
        raise ModelError(
            f"{name}: config.json does not describe a '{config.get('model_type')}' model "
            f"({one_line(exc)})"
        ) from exc
    try:
        build_lazily(path, lazy=True)
    except Exception as exc:  # missing, extra or misshapen tensors; damaged files
        raise ModelError(f"{name}: the weights do not match config.json ({one_line(exc)})") from exc


def user_path(path: Path | str) -> Path:
    """``path`` with a leading ``~`` expanded; left as it is when there is no such user."""
    try:
        return Path(path).expanduser()
    except RuntimeError:  # "~nobody-here/model": pathlib cannot find that home folder
        return Path(path)


def read_error(exc: OSError) -> str:
    """An OS error reading a model's file, as a short phrase without the full path."""
    what = Path(str(exc.filename)).name if exc.filename else "the folder"
    reason = exc.strerror or first_line(exc)
    return f"cannot read {what} ({reason[:1].lower()}{reason[1:]})"


def check_sizes(config: dict[str, Any], name: str, *, source: str = "config.json") -> None:
    """Refuses sizes no real model has, before anything is built from them.

    Args:
        config: The model's config.
        name: The model's name, which starts the message.
        source: Where the config came from, for the message.

    Raises:
        ModelError: With a one-line reason.
    """
    text_config = config.get("text_config")
    for section in (config, text_config if isinstance(text_config, dict) else {}):
        for key, ceiling in _CEILINGS.items():
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > ceiling:
                raise ModelError(f"{name}: {source} gives an implausible {key} ({value})")


def is_model_file(file: Path, name: str) -> bool:
    """Whether ``file`` is a regular file (a link to one counts); ``False`` when there is none.

    Anything else in its place is an error, named by the model ``name``: a
    FIFO blocks a read forever and a device such as ``/dev/zero`` never ends one.

    Raises:
        ModelError: A broken link, a folder, or a FIFO, device or socket.
    """
    if (problem := not_regular(file)) is not None:
        raise ModelError(f"{name}: {file.name} {problem}")
    return file.is_file()


def load_json(file: Path, name: str) -> dict[str, Any]:
    """The JSON object in a model folder's ``file``, read only when it is a regular file.

    Raises:
        ModelError: It is missing, no regular file, unreadable or not a JSON object.
        OSError: It cannot be read (permission denied, a vanished disk).
    """
    if not is_model_file(file, name):
        raise ModelError(f"{name}: no {file.name}")
    return _load_json(file, name)


def _load_json(file: Path, name: str) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # deep nesting recurses
        raise ModelError(f"{name}: {file.name} is unreadable ({first_line(exc)})") from exc
    if not isinstance(data, dict):
        raise ModelError(f"{name}: {file.name} is not a JSON object")
    return data


def _sniff_json(file: Path, name: str) -> None:
    """Checks that a file could be a JSON object by its first and last bytes.

    Parsing a tokenizer.json of several megabytes for each model in the library
    would be slow; an empty, truncated or garbage file fails this anyway.
    """
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(64)
        f.seek(max(0, size - 64))
        tail = f.read(64)
    if not head.strip():
        raise ModelError(f"{name}: {file.name} is empty")
    if not head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{") or not tail.rstrip().endswith(b"}"):
        raise ModelError(f"{name}: {file.name} is truncated or not JSON")


def _check_index(path: Path, name: str) -> None:
    """A shard index must name shards that are all there: else the download is incomplete."""
    index_file = path / "model.safetensors.index.json"
    if not is_model_file(index_file, name):
        return
    if index_file.stat().st_size > _MAX_INDEX_BYTES:
        raise ModelError(f"{name}: {index_file.name} is implausibly large")
    weight_map = _load_json(index_file, name).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ModelError(f"{name}: {index_file.name} has no weight_map")
    for shard in sorted({str(s) for s in weight_map.values()}):
        if not is_plain_name(shard):
            raise ModelError(f"{name}: {index_file.name} names a shard outside the folder")
        if not is_model_file(path / shard, name):
            raise ModelError(f"{name}: weight shard {shard} is missing")


def check_folder(path: Path | str) -> Path:
    """The resolved folder, once its config and weight headers look like a model.

    Reads no weights: it is cheap enough to run on every folder before any is loaded.

    Raises:
        ModelError: With a one-line reason.
    """
    path = user_path(path)
    try:
        if path.is_symlink() and not path.exists():
            raise ModelError(f"{path}: a broken or looping symbolic link")
        path = path.resolve()
    except RuntimeError as exc:  # pathlib's word for a symlink loop further up the path
        raise ModelError(f"{path}: a broken or looping symbolic link") from exc
    except OSError as exc:  # a folder above it that cannot be read
        raise ModelError(f"{path}: {read_error(exc)}") from exc
    check_weights(path, read_config(path))
    return path


def load_model(
    path: Path | str, *, fuse: bool = True, progress: BytesRead | None = None
) -> LoadedModel:
    """Loads a model folder with mlx-lm; never reaches for the network.

    Args:
        path: The model folder.
        fuse: Fuse each layer's projections (:mod:`app.engine.fuse`), which
            makes a step cheaper and leaves its arithmetic as it was.
        progress: Called with the bytes of weights read so far and in all,
            before the first group of weights is read and after each.

    Raises:
        ModelError: With a one-line reason.
    """
    from mlx_lm.utils import load

    path = check_folder(path)
    stamp = _stamp(path)
    try:
        # Lazily: the weights are read below a group at a time, so progress can move.
        with _types_transformers_lacks():
            loaded = load(str(path), lazy=True, return_config=True)
        model, tokenizer, config = cast(tuple[Any, Any, dict[str, Any]], loaded)
        _read_weights(model, progress or (lambda _done, _total: None))
    except Exception as exc:  # mlx-lm raises many kinds for broken folders
        raise ModelError(f"{path.name}: cannot load ({one_line(exc)})") from exc
    if fuse:
        from app.engine.fuse import fuse as fuse_projections

        fuse_projections(model)
    return LoadedModel(path, model, tokenizer, config, fused=fuse, stamp=stamp)


@contextlib.contextmanager
def _types_transformers_lacks() -> Iterator[None]:
    """Quiets transformers' warning, as it reads a folder's tokenizer, that it does not know
    the model's type (DeepSeek-V4's ``deepseek_v41``): mlx-lm builds the model, not it."""
    logger = logging.getLogger("transformers.configuration_utils")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _read_weights(model: nn.Module, progress: BytesRead) -> None:
    """Evaluates a lazily loaded model's weights in groups, reporting the bytes read."""
    leaves = cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))
    arrays = [a for _, a in leaves]
    total = sum(a.nbytes for a in arrays)
    group = max(total // _GROUPS, _MIN_GROUP_BYTES)
    done = pending = 0
    batch: list[mx.array] = []
    progress(0, total)
    for i, a in enumerate(arrays):
        batch.append(a)
        pending += a.nbytes
        if pending >= group or i == len(arrays) - 1:
            mx.eval(batch)
            done += pending
            progress(done, total)
            batch, pending = [], 0


def _stamp(path: Path) -> tuple[tuple[str, int, int], ...]:
    """The config's and weight files' names, sizes and modification times.

    A download or import that replaced them changes it: the model in memory is
    then no longer what the folder holds.
    """
    try:
        files = [path / "config.json", *weight_files(path)]
        stats = [(f.name, f.stat()) for f in files]
    except (OSError, ModelError):
        return ()  # unknown: never matches, so the folder is read again
    return tuple((name, st.st_size, st.st_mtime_ns) for name, st in stats)


def _kept(path: Path, fuse: bool, loaded: ModelPair | None) -> LoadedModel | None:
    """The model of ``loaded`` that is this very load of ``path``, if any."""
    if loaded is None:
        return None
    stamp = None  # the files' stat calls, made only for a model of this folder
    for model in (loaded.target, loaded.draft):
        if model is not None and (model.path, model.fused) == (path, fuse):
            stamp = _stamp(path) if stamp is None else stamp
            if stamp and stamp == model.stamp:
                return model
    return None


# A draft given as this word (not a folder: one of that name is given as ./mtp) is the
# target's own multi-token-prediction head.
MTP = "mtp"


def own_head(draft: Path | str | None) -> bool:
    """Whether ``draft``, as :func:`load_pair` takes it, is the target's own MTP head: the
    word :data:`MTP`, never a path (a folder of that name is a :class:`Path`)."""
    return isinstance(draft, str) and draft == MTP


# check(target, draft) raises IncompatiblePairError when the draft cannot draft for
# the target. The rule lives in app.hub.pair_check (it reads the folders, which
# this layer cannot import); the user-facing callers pass it.
PairCheck = Callable[[Path, Path], object]  # what it returns is ignored


def load_pair(
    target: Path | str,
    draft: Path | str | None = None,
    *,
    fuse: bool = True,
    progress: Callable[[LoadProgress], None] | None = None,
    check: PairCheck | None = None,
    loaded: ModelPair | None = None,
) -> ModelPair:
    """Loads a target and an optional draft and checks that they fit together.

    Args:
        target: The target's folder.
        draft: The draft's folder, if any; :data:`MTP` for the target's own head.
        fuse: Fuse projections (see :func:`load_model`).
        progress: Called with a :class:`LoadProgress` before each step, and
            as each model's weights are read.
        check: Judges the pair before any weight is read (from the folders' files,
            given as passed here), so a refused pair costs no load;
            ``app.hub.require_compatible`` is the rule every user-facing caller
            passes. ``None`` pairs any two models, as tests and tools may.
        loaded: The pair in memory now. A model of it that this load names again
            (the same resolved folder, unchanged on disk, fused alike) is kept
            rather than read twice; ``loaded`` itself is left as it was.

    Raises:
        ModelError: A folder cannot be loaded.
        IncompatiblePairError: The check refused the pair.
    """
    report = progress or (lambda _p: None)
    if own_head(draft):
        return _with_head(check_folder(target), fuse, loaded, report)
    steps = 1 if draft is None else 3
    # Both folders are checked before any weights are read: a draft folder that
    # is not a model must not cost a load of the target first.
    target_path = check_folder(target)
    draft_path = check_folder(draft) if draft is not None else None
    if draft is not None and draft_path is not None:
        report(LoadProgress(0, steps, "Checking the pair"))
        if check is not None:
            check(Path(target), Path(draft))
    t = _load_or_keep(target_path, fuse, loaded, 0 if draft_path is None else 1, steps, report)
    if draft is None or draft_path is None:
        return ModelPair(t)
    d = _load_or_keep(draft_path, fuse, loaded, 2, steps, report)
    return ModelPair(t, d)


def _with_head(
    path: Path, fuse: bool, loaded: ModelPair | None, report: Callable[[LoadProgress], None]
) -> ModelPair:
    """The target at ``path`` drafting with its own MTP head (:mod:`app.engine.mtp`)."""
    from app.engine.mtp import MTPDraft, load_head

    t = _load_or_keep(path, fuse, loaded, 0, 2, report)
    report(LoadProgress(1, 2, f"Loading {path.name}'s MTP head"))
    head = load_head(path, t.model, t.config)
    draft = LoadedModel(path / MTP, MTPDraft(t.model, head), t.tokenizer, {"model_type": MTP})
    return ModelPair(t, draft)


def _load_or_keep(
    path: Path,
    fuse: bool,
    loaded: ModelPair | None,
    step: int,
    steps: int,
    report: Callable[[LoadProgress], None],
) -> LoadedModel:
    kept = _kept(path, fuse, loaded)
    if kept is not None:
        report(LoadProgress(step, steps, f"Keeping {path.name}, loaded already"))
        return kept
    text = f"Loading {path.name}"
    report(LoadProgress(step, steps, text))
    start = time.monotonic()

    def read(done: int, total: int) -> None:
        elapsed = time.monotonic() - start
        # The rate so far predicts the rest once a little has been read.
        left = (total - done) * elapsed / done if 0 < done < total and elapsed > 0 else None
        report(LoadProgress(step, steps, text, done, total, left))

    return load_model(path, fuse=fuse, progress=read)


def free_memory() -> None:
    """Returns freed arrays to the system; call after dropping a pair, on its thread."""
    import gc

    gc.collect()
    mx.clear_cache()
