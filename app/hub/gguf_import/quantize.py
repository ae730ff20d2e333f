"""Re-quantization: a converted float model quantized with MLX, group size 64."""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from app.errors import ModelError, first_line
from app.hub.gguf_import.common import ImportProgress, _check_cancel, _Planned
from app.hub.gguf_import.shards import _shard, _write_shards

_GROUP_SIZE = 64


def _quantize(
    weights_dir: Path,
    out: Path,
    config: dict[str, Any],
    q_bits: int,
    report: Callable[[ImportProgress], None],
    cancel: threading.Event | None,
) -> dict[str, Any]:
    """Quantizes the model in ``weights_dir`` with mlx-lm and writes it into ``out``."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model, quantize_model

    try:
        # Lazy: each weight is read from disk only when its quantized form is written.
        model, loaded = load_model(weights_dir, lazy=True)
        # mlx-lm prints its bits per weight; the CLI's output is the new folder alone.
        with contextlib.redirect_stdout(io.StringIO()):
            model, quantized = quantize_model(model, loaded, group_size=_GROUP_SIZE, bits=q_bits)
    except Exception as exc:  # mlx-lm raises many kinds for a config it cannot build
        raise ModelError(f"cannot quantize the model ({first_line(exc)})") from exc
    params: dict[str, Any] = dict(tree_flatten(model.parameters()))
    params.update(_quantized_head(model, weights_dir, config, q_bits))
    del model
    plan = [
        _Planned(None, name, tuple(a.shape), _mx_code(a.dtype), int(a.nbytes))
        for name, a in params.items()
    ]

    def produce(p: _Planned) -> np.ndarray:
        a = params.pop(p.name)
        mx.eval(a)
        if a.dtype == mx.bfloat16:
            a = a.view(mx.uint16)
        return np.asarray(a)

    def written(done: int, total: int) -> None:
        report(ImportProgress("quantizing", done, total))
        if done < total:
            _check_cancel(cancel)

    report(ImportProgress("quantizing", 0, len(plan)))
    _write_shards(out, _shard(plan), produce, written)
    config = dict(config)
    config["quantization"] = quantized["quantization"]
    config["quantization_config"] = quantized["quantization"]
    return config


def _quantized_head(
    model: Any, weights_dir: Path, config: dict[str, Any], q_bits: int
) -> dict[str, Any]:
    """The model's MTP head, which mlx-lm drops at load, quantized as the model is.

    Its norms are kept as applied, as the quantized folder's other norms are.
    """
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from app.engine.mtp import head_of, head_weights, mtp_layers, stored_name

    layers = mtp_layers(config)
    weights = head_weights(weights_dir, config, model) if layers else {}
    if not weights:  # a config naming a head its weights leave out
        return {}
    head: nn.Module = head_of(model, config)
    head.load_weights(list(weights.items()), strict=True)
    nn.quantize(
        head,
        group_size=_GROUP_SIZE,
        bits=q_bits,
        class_predicate=lambda _, m: (
            hasattr(m, "to_quantized") and m.weight.shape[-1] % _GROUP_SIZE == 0
        ),
    )
    leaves = cast(list[tuple[str, Any]], tree_flatten(head.parameters()))
    return {stored_name(k, config): v for k, v in leaves}


def _mx_code(dtype: Any) -> str:
    import mlx.core as mx

    codes = {
        mx.float32: "F32",
        mx.float16: "F16",
        mx.bfloat16: "BF16",
        mx.uint32: "U32",
        mx.uint8: "U8",
        mx.int32: "I32",
    }
    if dtype not in codes:
        raise ModelError(f"cannot save a weight of type {dtype}")
    return codes[dtype]
