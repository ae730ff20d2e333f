"""Whether a target and draft pair fits in memory, estimated without loading weights.

The estimate is deliberately simple and errs on the large side: the weights as
stored on disk, a full-length KV cache for both models, and a margin for
activations. Sliding-window layers (Gemma 3) need less cache than counted here.
It is judged against the memory the system can give now (not the machine's
total), less what the pair already loaded keeps while the new one loads.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.engine.loader import (
    config_model,
    dequantizes_fp8,
    own_head,
    read_config,
    read_header,
    user_path,
)
from app.errors import ModelError
from app.hub.library import human_size

if TYPE_CHECKING:
    from app.engine.caches import Layout

_GIB = 1024**3
# Left to the OS and other apps where MLX does not report a working-set limit.
_HEADROOM_BYTES = 2 * _GIB
# Metal lets a process wire about three quarters of unified memory for the GPU
# (its recommendedMaxWorkingSetSize); weights beyond that page and crawl.
_METAL_SHARE = 0.75
# Activations, the sampler's buffers and allocator slack on top of weights and KV.
_OVERHEAD = 0.10
# Layers with more than one attention, each with its own cache (mlx-lm's classes fix the count).
_ATTENTIONS_PER_LAYER = {"longcat_flash": 2, "longcat_flash_ngram": 2}


@dataclass(frozen=True, slots=True)
class MemoryFit:
    """The memory a pair needs against the memory MLX can use.

    Attributes:
        weights_bytes: Weights of both models as stored on disk.
        kv_bytes: KV caches of both models at the context length checked.
        needed_bytes: Weights plus KV plus the activation margin.
        available_bytes: Memory MLX can use for the models now, less what stays
            loaded while they load.
        fits: Whether ``needed_bytes - reused_bytes <= available_bytes``.
        detail: One line with the numbers, for the user.
        reused_bytes: Weights of models already loaded that the load keeps: part
            of ``needed_bytes`` and already in memory, so counted once.
        held_bytes: Weights of the loaded pair, which stay in memory until the
            new pair has loaded (``available_bytes`` is net of them).
        state_bytes: Recurrent states of hybrid models, one request's and the
            copies marked for a retry or an edit; part of ``needed_bytes``.
    """

    weights_bytes: int
    kv_bytes: int
    needed_bytes: int
    available_bytes: int
    fits: bool
    detail: str
    reused_bytes: int = 0
    held_bytes: int = 0
    state_bytes: int = 0


def total_memory_bytes() -> int:
    """Returns the machine's physical memory (unified memory on Apple Silicon).

    Raises:
        OSError: The platform reports no memory size.
    """
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["/usr/sbin/sysctl", "-n", "hw.memsize"],
                capture_output=True,
                text=True,
                check=True,
                timeout=5,
            ).stdout
            return int(out.strip())
        except (OSError, ValueError, subprocess.SubprocessError):
            pass  # sysconf below also works on macOS
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError) as exc:
        raise OSError(f"cannot read the memory size ({exc})") from exc
    if total <= 0:
        raise OSError("cannot read the memory size")
    return total


def available_memory_bytes() -> int | None:
    """Returns the memory the system can give a process now without swapping.

    Linux's own estimate (``MemAvailable`` in ``/proc/meminfo``); on macOS the
    free and inactive pages ``vm_stat`` counts (as psutil reckons it). What this
    process already holds, a loaded pair included, is not in it.

    Returns:
        Bytes, or ``None`` where the platform does not say.
    """
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024  # the kernel counts in kB
        except (OSError, ValueError, IndexError):
            pass
        return None
    # elif/else, not fall-through: mypy then skips the other platforms' branches
    # instead of calling them unreachable.
    elif sys.platform == "darwin":
        return _vm_stat_available()
    else:
        return None


def usable_memory_bytes(total: int | None = None, *, free: int | None = None, held: int = 0) -> int:
    """Returns the memory MLX can use for models about to load.

    Args:
        total: Physical memory; the machine's own when omitted.
        free: Memory the system can give now; :func:`available_memory_bytes`
            when ``total`` is omitted too, else not judged.
        held: Bytes this process keeps in memory during the load (the loaded
            pair stays until the new one is in); the ceiling below is for all
            of MLX's memory, so they come off it. ``free`` already lacks them.

    Returns:
        The least of ``free`` and a ceiling less ``held``. The ceiling is, on
        macOS, about 75 % of ``total`` (Metal's recommended working set, past
        which wired GPU memory starts to swap); elsewhere ``total`` less 2 GiB
        for the OS. Never negative.
    """
    if total is None and free is None:  # this machine, now
        free = available_memory_bytes()
    recommended = _metal_working_set() if sys.platform == "darwin" and total is None else None
    if recommended:
        ceiling = recommended
    else:
        total = total_memory_bytes() if total is None else total
        ceiling = int(total * _METAL_SHARE) if sys.platform == "darwin" else total - _HEADROOM_BYTES
    usable = ceiling - held
    if free is not None:
        usable = min(usable, free)
    return max(0, usable)


def kv_cache_bytes(config: dict[str, Any], context_length: int, dtype_bytes: int = 2) -> int:
    """Returns the bytes of a full KV cache for one sequence.

    Args:
        config: The model's ``config.json``; multimodal configs (Gemma 3) keep
            the language model's settings under ``text_config``.
        context_length: Tokens the cache holds.
        dtype_bytes: Bytes per cached value; 2 for float16 and bfloat16.

    Returns:
        ``2 (K and V) × attention layers × KV heads × head size × tokens × dtype_bytes``
        (LongCat-Flash's layers have two attentions each); for
        multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash, Kimi-Linear), whose
        cache holds a token's latent and its rope key, ``layers × (kv_lora_rank +
        qk_rope_head_dim) × tokens × dtype_bytes``, and with sparse attention
        (DeepSeek-V3.2, GLM-5) its indexer's key and a value as wide (mlx-lm keeps zeros
        there), ``2 × index_head_dim`` more; DeepSeek-V4's windows and compressed groups
        as :func:`_sparse_kv_bytes` counts them.

    Raises:
        ModelError: The config lacks the layer count or the attention shape.
    """
    section = _text_section(config)
    if isinstance(section.get("compress_ratios"), list):
        return _sparse_kv_bytes(section, context_length, dtype_bytes)
    attentions = _ATTENTIONS_PER_LAYER.get(str(section.get("model_type")), 1)
    layers = (_layers(section) or 0) * attentions
    latent = _int(section, "kv_lora_rank")
    if layers and latent:
        rope = _int(section, "qk_rope_head_dim") or 0
        indexer = 2 * (_int(section, "index_head_dim") or 0)
        return layers * (latent + rope + indexer) * max(0, context_length) * dtype_bytes
    heads = _int(section, "num_attention_heads")
    hidden = _int(section, "hidden_size")
    head_dim = _int(section, "head_dim") or (hidden // heads if hidden and heads else None)
    kv_heads = _int(section, "num_key_value_heads") or heads
    if not layers or not head_dim or not kv_heads:
        raise ModelError("config.json does not give the attention shape (layers, heads, head size)")
    return 2 * layers * kv_heads * head_dim * max(0, context_length) * dtype_bytes


def _sparse_kv_bytes(section: dict[str, Any], tokens: int, dtype_bytes: int) -> int:
    """DeepSeek-V4's layers: each a window of one key-value row a token (its slack and a
    prompt chunk too), and where a layer compresses, a latent per ``ratio`` tokens with, in
    index layers, an index key (:class:`~app.engine.sparse.SparseCache`)."""
    from app.engine.caches import WindowKVCache

    width, index = _int(section, "head_dim") or 0, _int(section, "index_head_dim") or 0
    window = WindowKVCache.rows_held(_int(section, "sliding_window") or 128, tokens) * width
    layers = _layers(section) or 0
    ratios = list(section["compress_ratios"])[:layers]
    sources = set(section.get("kv_source_layer_ids") or ())
    indexed = sources & set(section.get("index_source_layer_ids") or ())
    rows = layers * window
    for i, ratio in enumerate(ratios):
        if ratio and i in sources:
            rows += max(0, tokens) // ratio * (width + (index if i in indexed else 0))
    return rows * dtype_bytes


def cache_layout(config: dict[str, Any]) -> Layout | None:
    """What one request's caches hold in a model of ``config``, by kind of layer; None where
    mlx-lm cannot build it (every layer then counted as growing with the context)."""
    return _layout(json.dumps(config, sort_keys=True))


@functools.lru_cache(maxsize=8)
def _layout(config: str) -> Layout | None:
    """:func:`cache_layout` of a config's JSON, built once (a model object, never evaluated)."""
    from app.engine.caches import layout

    try:
        return layout(config_model(json.loads(config)))
    except Exception:  # mlx-lm model classes reject odd configs in many ways
        return None


def request_cache_bytes(
    config: dict[str, Any], tokens: int, drafts: bool = False
) -> tuple[int, int]:
    """One request's caches in a model: its KV caches at ``tokens`` and its recurrent states.

    A sliding-window layer keeps the rows its window holds (window, slack and a
    prompt chunk: :meth:`~app.engine.caches.WindowKVCache.rows_held`), others every
    token's. A hybrid model's KV caches are its attention layers'; its states count a
    request's own, its marked copies, those before each forward it can go back
    into (a draft's round of steps, where ``drafts``; a target's newest rounds)
    and, where a verification keeps the state after each row (off Metal),
    those of the longest verification.

    Raises:
        ModelError: The config lacks the attention shape.
    """
    from app.engine.caches import WindowKVCache
    from app.engine.recurrent import FORWARDS, MARKS, ROWS_KEPT, TARGET_FORWARDS, steps_kept

    caches = cache_layout(config)
    if caches is None:
        return kv_cache_bytes(config, tokens), 0
    kv = 0
    if caches.growing or caches.windows:  # Mamba alone has no attention shape to read
        rows = [tokens] * caches.growing + [
            WindowKVCache.rows_held(w, tokens) for w in caches.windows
        ]
        kv = sum(_layer_kv_bytes(config, n) for n in rows)
    forwards = FORWARDS if drafts else TARGET_FORWARDS
    copies = 1 + MARKS + forwards + (ROWS_KEPT if steps_kept() else 0)
    return kv, caches.state * copies


def head_cache_bytes(config: dict[str, Any], tokens: int) -> int:
    """What a target's own MTP head adds for one request at ``tokens``: its layers' KV
    caches and the target's output states it has not read yet (the head's weights are
    in the target's files, counted with them)."""
    from app.engine.mtp import head_layers

    hidden = _int(_text_section(config), "hidden_size") or 0
    return head_layers(config) * _layer_kv_bytes(config, tokens) + tokens * hidden * 2


def _layer_kv_bytes(config: dict[str, Any], tokens: int) -> int:
    """One attention layer's keys and values at ``tokens``: :func:`kv_cache_bytes` counts
    every layer the config names."""
    return kv_cache_bytes(config, tokens) // (_layers(_text_section(config)) or 1)


def memory_fit(
    target: Path,
    draft: Path | str | None,
    context_length: int = 8192,
    available: int | None = None,
    *,
    loaded: Sequence[Path] = (),
) -> MemoryFit:
    """Estimates whether a target, with an optional draft, fits in memory.

    Args:
        target: The target model folder.
        draft: The draft model folder, ``None`` for the target alone, or
            :data:`~app.engine.loader.MTP` for the target's own MTP head
            (:func:`~app.engine.loader.own_head`).
        context_length: Tokens of context to budget the KV caches for; each
            model is capped at its own trained context length.
        available: Usable memory, net of what stays loaded;
            ``usable_memory_bytes(held=...)`` of the loaded weights when omitted.
        loaded: Folders of the models in memory now. All stay there while the
            new pair loads (the engine swaps pairs only once the new one is in);
            one the new pair names again is kept, not read twice.

    Returns:
        The estimate with a one-line ``detail``.

    Raises:
        ModelError: A folder is not a usable model; the message is one line.
    """
    weights = kv = reused = states = 0
    tokens = context_length
    in_memory = {_key(p) for p in loaded}
    held = sum(_weights_size(k) for k in in_memory)
    counted: set[Path] = set()
    head = own_head(draft)
    folders = [target] if draft is None or head else [target, Path(draft)]
    for i, folder in enumerate(folders):
        folder = user_path(folder)
        config = read_config(folder)
        model_tokens = min(context_length, _context_length(config) or context_length)
        if i == 0:
            tokens = model_tokens  # the target bounds what the pair can hold
        size = _weights_size(folder)
        weights += size
        key = _key(folder)
        if key in in_memory and key not in counted:
            reused += size  # already in memory, and the load keeps it
            counted.add(key)
        try:
            model_kv, model_states = request_cache_bytes(config, model_tokens, drafts=i > 0)
        except ModelError as exc:
            raise ModelError(f"{folder.name}: {exc}") from exc
        kv += model_kv + (head_cache_bytes(config, model_tokens) if head and i == 0 else 0)
        states += model_states
    needed = int((weights + kv + states) * (1 + _OVERHEAD))
    if available is None:
        available = usable_memory_bytes(held=held)
    fits = needed - reused <= available
    detail = (
        f"needs {human_size(needed)} (weights {human_size(weights)} + KV cache "
        f"{human_size(kv)} at {tokens:,} tokens"
        + (f" + recurrent states {human_size(states)}" if states else "")
        + f" + {_OVERHEAD:.0%} overhead) "
        f"of {human_size(available)} usable"
    )
    if held:
        detail += f" while the loaded {human_size(held)} stays in memory"
    if reused:
        detail += f", {human_size(reused)} of it loaded already"
    if not fits:
        detail += f"; {human_size(needed - reused - available)} short"
    return MemoryFit(weights, kv, needed, available, fits, detail, reused, held, states)


def _vm_stat_available() -> int | None:
    """Free plus inactive pages, as macOS's ``vm_stat`` counts them, in bytes."""
    try:
        out = subprocess.run(
            ["/usr/bin/vm_stat"], capture_output=True, text=True, check=True, timeout=5
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # "Mach Virtual Memory Statistics: (page size of 16384 bytes)", then "Pages free: 1234."
    page = re.search(r"page size of (\d+) bytes", out)
    counts = dict(re.findall(r"^Pages (free|inactive):\s+(\d+)\.?$", out, re.MULTILINE))
    if page is None or len(counts) < 2:
        return None
    return int(page.group(1)) * sum(int(n) for n in counts.values())


def _key(folder: Path) -> Path:
    """A folder as one model: the same after ``~`` and symbolic links are resolved."""
    try:
        return user_path(folder).resolve()
    except (OSError, RuntimeError):
        return user_path(folder)


def _metal_working_set() -> int | None:
    """Metal's own working-set limit, when MLX can report it."""
    try:
        import mlx.core as mx

        info = mx.device_info()
        value = info.get("max_recommended_working_set_size")
    except Exception:  # older MLX or no Metal device: fall back to the share
        return None
    return int(value) if isinstance(value, int) and value > 0 else None


def _text_section(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's settings, merged as mlx-lm reads Gemma 3 style configs."""
    text_config = config.get("text_config")
    if not isinstance(text_config, dict):
        return config
    merged = {**config, **text_config}
    if config.get("model_type") == "gemma3":
        # mlx-lm's gemma3 fills these in when the checkpoint leaves them out.
        merged.setdefault("num_attention_heads", 8)
        merged.setdefault("num_key_value_heads", 4)
    return merged


def _layers(section: dict[str, Any]) -> int | None:
    """The model's layer count, under the name its config gives it (LongCat-Flash's
    ``num_layers``)."""
    return _int(section, "num_hidden_layers") or _int(section, "num_layers")


def _int(section: dict[str, Any], key: str) -> int | None:
    value = section.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _context_length(config: dict[str, Any]) -> int | None:
    section = _text_section(config)
    for key in ("max_position_embeddings", "max_sequence_length", "max_seq_len", "seq_length"):
        value = _int(section, key)
        if value:
            return value
    return None


def _weights_size(folder: Path) -> int:
    """Bytes of the safetensors files, following the Hub cache's symlinks to the blobs, and
    a byte more for each fp8 weight: mlx-lm's model dequantizes them to bfloat16 at load."""
    files = [f for f in folder.glob("*.safetensors") if f.is_file()]
    size = sum(f.stat().st_size for f in files)
    try:
        config = read_config(folder)
    except ModelError:
        return size
    if not dequantizes_fp8(config):
        return size
    headers = (read_header(f).values() for f in files)
    return size + sum(math.prod(t.shape) for h in headers for t in h if t.dtype.startswith("F8"))
