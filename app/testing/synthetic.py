"""Synthetic model pairs of real shapes with a set greedy acceptance.

Every layer's output projections are zero, so each hidden state is its token's
embedding; embeddings and the LM head are wired so that next(t) = t + 1 on a
short cycle. The draft predicts t + 2 instead for a chosen fraction of tokens,
so its greedy acceptance is known in advance. The other weights are random,
so every forward costs what the real shape costs, and no weights need to be
downloaded.

Shapes come in three families, qwen2 (Qwen2.5), llama (Llama 3.x) and
qwen3_5 (Qwen3.5 / 3.6: Gated DeltaNet layers with full attention every few);
see :data:`SHAPES`. A Gated DeltaNet layer's output projection is zero too, so
its state is read and written at full cost and never reaches the tokens.
Models can be quantized to 4 or 8 bits: the one-hot rows of the embedding
and head (values 0 and 1) survive affine quantization exactly, so the cycle,
and the draft's acceptance, are the same as in full precision.
"""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass
from typing import Any, Literal

import mlx.core as mx
import mlx.nn as nn

Family = Literal["qwen2", "llama", "qwen3_5"]

CYCLE_START = 10
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True)
class Shape:
    """The dimensions of a model, as its ``config.json`` gives them.

    Attributes:
        family: The mlx-lm model module (and ``model_type``).
        layers: Number of decoder layers.
        hidden: Hidden size.
        heads: Attention heads.
        kv_heads: Key/value heads.
        intermediate: MLP intermediate size.
        vocab: Vocabulary size.
        head_size: Attention head size; 0 for ``hidden // heads``.
        linear: Gated DeltaNet key heads, value heads and head size (qwen3_5).
        full_every: One layer in this many has full attention (qwen3_5).
    """

    family: Family
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_size: int = 0
    linear: tuple[int, int, int] = (0, 0, 0)
    full_every: int = 0

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads


SHAPES: dict[str, Shape] = {
    # Test sizes: hidden and intermediate are multiples of 64, so they quantize.
    "tiny": Shape("qwen2", 2, 64, 4, 2, 128, 384),
    "tiny-llama": Shape("llama", 2, 64, 4, 2, 128, 384),
    # Qwen2.5
    "0.5b": Shape("qwen2", 24, 896, 14, 2, 4864, 151936),
    "1.5b": Shape("qwen2", 28, 1536, 12, 2, 8960, 151936),
    "7b": Shape("qwen2", 28, 3584, 28, 4, 18944, 152064),
    "32b": Shape("qwen2", 64, 5120, 40, 8, 27648, 152064),
    # Llama 3.1 (8B, 70B) and 3.2 (1B, 3B)
    "1b": Shape("llama", 16, 2048, 32, 8, 8192, 128256),
    "3b": Shape("llama", 28, 3072, 24, 8, 8192, 128256),
    "8b": Shape("llama", 32, 4096, 32, 8, 14336, 128256),
    "70b": Shape("llama", 80, 8192, 64, 8, 28672, 128256),
    # Qwen3.6-27B (48 of 64 layers Gated DeltaNet) and Qwen3.5-0.8B; and a target of
    # the 27B's size with attention in every layer, to weigh what the hybrid costs.
    "qwen3.6-27b": Shape("qwen3_5", 64, 5120, 24, 4, 17408, 248320, 256, (16, 48, 128), 4),
    "qwen3.5-0.8b": Shape("qwen3_5", 24, 1024, 8, 2, 3584, 248320, 256, (16, 16, 128), 4),
    "27b-attention": Shape("llama", 64, 5120, 24, 4, 17408, 248320, 256),
    "tiny-hybrid": Shape("qwen3_5", 4, 64, 4, 2, 128, 384, 16, (2, 4, 16), 2),
    # The 27B's 64 layers at test widths: where Python's share of a step is largest.
    "tiny-hybrid-deep": Shape("qwen3_5", 64, 64, 4, 2, 128, 384, 16, (2, 4, 16), 4),
    # Wide enough beside its cycle for an MTP head's own states (:func:`build_head`).
    "tiny-hybrid-wide": Shape("qwen3_5", 4, 128, 4, 2, 256, 384, 32, (2, 4, 32), 2),
}
# The draft of a pair spec that is the target's own MTP head: "qwen3.6-27b:mtp".
HEAD = "mtp"

_FAMILY_CONFIG: dict[Family, dict[str, Any]] = {
    "qwen2": {
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
    },
    # Llama 3's rope_scaling is left out: it changes the frequencies, not the cost.
    "llama": {
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "qwen3_5": {
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "linear_conv_kernel_dim": 4,
        "partial_rotary_factor": 0.25,
        "rope_parameters": {"type": "default", "rope_theta": 10000000.0},
    },
}


def _shape(name: str) -> Shape:
    if name not in SHAPES:
        raise ValueError(f"unknown shape '{name}' (one of {', '.join(SHAPES)})")
    return SHAPES[name]


def config(shape: str, vocab_size: int | None = None) -> dict[str, Any]:
    """The ``config.json`` of a named shape, for its family's mlx-lm model.

    Args:
        shape: One of :data:`SHAPES`.
        vocab_size: Overrides the shape's vocabulary.

    Raises:
        ValueError: The shape is unknown.
    """
    s = _shape(shape)
    cfg: dict[str, Any] = {
        "model_type": s.family,
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "intermediate_size": s.intermediate,
        "vocab_size": s.vocab if vocab_size is None else vocab_size,
        # The head is wired apart from the embedding, so it must not be tied.
        "tie_word_embeddings": False,
        **_FAMILY_CONFIG[s.family],
    }
    if s.family != "qwen2":
        cfg["head_dim"] = s.head_dim
    if s.family == "qwen3_5":
        keys, values, size = s.linear
        text = {
            **cfg,
            "model_type": "qwen3_5_text",
            "linear_num_key_heads": keys,
            "linear_num_value_heads": values,
            "linear_key_head_dim": size,
            "linear_value_head_dim": size,
            "full_attention_interval": s.full_every,
        }
        return {"model_type": "qwen3_5", "text_config": text, **{k: cfg[k] for k in _TOP}}
    return cfg


# What a qwen3_5 config keeps at its top level beside its text model's.
_TOP = ("vocab_size", "tie_word_embeddings")


def describe(shape: str) -> str:
    """One line for logs and benchmark tables, e.g. ``"llama 80 layers, hidden 8192"``."""
    s = _shape(shape)
    linear = f" ({s.layers - s.layers // s.full_every} Gated DeltaNet)" if s.full_every else ""
    return f"{s.family} {s.layers} layers{linear}, hidden {s.hidden}"


def cycle_length(shape: str) -> int:
    """Number of tokens in the cycle the models continue."""
    return min(64, _shape(shape).hidden)


def _check_quantization(shape: str, bits: int | None, group_size: int) -> None:
    if bits is None:
        return
    if bits not in BITS:
        raise ValueError(f"bits must be None, 4 or 8, not {bits}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, not {group_size}")
    s = _shape(shape)
    # Quantization groups run along each weight's input dimension.
    dims = {
        "hidden size": s.hidden,
        "attention width": s.heads * s.head_dim,
        "intermediate size": s.intermediate,
    }
    if s.full_every:
        dims["Gated DeltaNet width"] = s.linear[1] * s.linear[2]
    bad = [f"{name} {dim}" for name, dim in dims.items() if dim % group_size]
    if bad:
        raise ValueError(
            f"shape '{shape}' cannot be quantized with group size {group_size}: "
            f"{', '.join(bad)} must be multiples of {group_size}"
        )


def _one_hot(vocab: int, hidden: int, rows: list[int], dtype: mx.Dtype) -> mx.array:
    """A ``vocab x hidden`` matrix with a 1 at ``(rows[i], i)`` for each i."""
    m = mx.zeros((vocab, hidden), dtype=dtype)
    m[mx.array(rows), mx.arange(len(rows))] = 1.0
    return m


def build(
    shape: str,
    *,
    miss: float = 0.0,
    vocab_size: int | None = None,
    dtype: mx.Dtype = mx.float32,
    seed: int = 0,
    bits: int | None = None,
    group_size: int = 64,
) -> nn.Module:
    """A model whose greedy continuation of cycle token t is t + 1.

    The model is built one decoder layer at a time: MLX arrays are lazy, so
    the module's random weights exist only as a graph until each layer is
    zeroed where it must be, quantized if asked, and evaluated. Peak memory is
    therefore about the finished model plus the larger of one decoder layer
    and one ``vocab x hidden`` matrix in ``dtype``, never the whole model in
    full precision. For a 4-bit 70B in bfloat16 that is about 40 GB plus
    about 2 GB (44 GB plus 4 GB in float32, whose scales are float32 too),
    against 141 GB for the 70B in bfloat16.

    Args:
        shape: One of :data:`SHAPES`.
        miss: Fraction of cycle tokens for which it predicts t + 2 instead
            (a draft that the target rejects there).
        vocab_size: Overrides the shape's vocabulary (a draft must match its target).
        dtype: Dtype of the weights, and of the scales and biases when quantized.
        seed: Seed of the random weights.
        bits: 4 or 8 to quantize every Linear layer, the embedding and the
            head (affine, as ``mlx.nn.quantize`` does); None keeps ``dtype``.
        group_size: Quantization group size.

    Raises:
        ValueError: The shape is unknown, ``bits`` is not None, 4 or 8, or the
            shape's dimensions are not multiples of ``group_size``.
    """
    cfg = config(shape, vocab_size)
    _check_quantization(shape, bits, group_size)
    family = importlib.import_module(f"mlx_lm.models.{cfg['model_type']}")
    mx.random.seed(seed)
    # Lazy: nothing is allocated until a layer is evaluated below.
    model: nn.Module = family.Model(family.ModelArgs.from_dict(cfg))
    text: Any = getattr(model, "language_model", model)  # qwen3_5 wraps its text model
    for layer in text.model.layers:
        layer.set_dtype(dtype)
        mixer = layer.linear_attn.out_proj if hasattr(layer, "linear_attn") else None
        out = mixer if mixer is not None else layer.self_attn.o_proj
        out.weight = mx.zeros_like(out.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
        if bits is not None:
            nn.quantize(layer, group_size, bits)
        mx.eval(layer.parameters())
    text.model.norm.set_dtype(dtype)
    mx.eval(text.model.norm.parameters())

    hidden, vocab = _shape(shape).hidden, cfg["vocab_size"]
    length = cycle_length(shape)
    embed = _one_hot(vocab, hidden, [CYCLE_START + i for i in range(length)], dtype)
    text.model.embed_tokens.weight = embed
    if bits is not None:
        text.model.embed_tokens = text.model.embed_tokens.to_quantized(group_size, bits)
    mx.eval(text.model.embed_tokens.parameters())
    del embed

    # Scatter the misses: an even spacing would alias with the rhythm of rounds.
    missed = set(random.Random(seed).sample(range(length), round(miss * length)))
    nexts = [CYCLE_START + (i + (2 if i in missed else 1)) % length for i in range(length)]
    head = _one_hot(vocab, hidden, nexts, dtype)
    if hidden >= 2 * length:  # an MTP head's own states, beside the cycle (build_head)
        head[mx.array(nexts), mx.arange(length) + length] = 1.0
    text.lm_head.weight = head
    if bits is not None:
        text.lm_head = text.lm_head.to_quantized(group_size, bits)
    mx.eval(text.lm_head.parameters())
    del head
    # Hand the freed full-precision buffers back rather than keep them cached.
    mx.clear_cache()
    return model


def build_head(
    target: nn.Module,
    shape: str,
    *,
    miss: float = 0.0,
    dtype: mx.Dtype = mx.float32,
    seed: int = 1,
    bits: int | None = None,
    group_size: int = 64,
) -> nn.Module:
    """``target``'s MTP head (:class:`app.engine.mtp.MTPDraft`), wired as the drafts here are.

    Its layer adds nothing (output projections zero), and ``fc`` maps the
    embedding of token t + 1 to the state the target's head reads as t + 2, so
    the head drafts the cycle, but for a ``miss`` share of positions, where it
    drafts t + 3. As real heads do, it misses more with depth: where the model
    is wide enough (every shape but the tiny ones), it writes its own states
    beside the cycle's, and from depth 2, reading them, misses a further
    ``miss`` share of positions. The layer is quantized where ``bits`` says;
    ``fc`` stays in ``dtype`` (its 2s would not quantize exactly).
    """
    from app.engine.mtp import MTPDraft, MTPHead

    _check_quantization(shape, bits, group_size)
    hidden, length = _shape(shape).hidden, cycle_length(shape)
    mx.random.seed(seed)
    head = MTPHead(target)
    for layer in head.layers:
        layer.set_dtype(dtype)
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
        if bits is not None:
            nn.quantize(layer, group_size, bits)
    for norm in (head.pre_fc_norm_embedding, head.pre_fc_norm_hidden, head.norm):
        norm.set_dtype(dtype)
    rng = random.Random(seed)
    missed = set(rng.sample(range(length), round(miss * length)))
    own = length if hidden >= 2 * length else 0  # where its states go
    fc = mx.zeros((hidden, 2 * hidden), dtype=dtype)
    rows = [own + ((j + 1) % length if j in missed else j) for j in range(length)]
    fc[mx.array(rows), mx.arange(length)] = 1.0
    deeper = rng.sample(sorted(set(range(length)) - missed), round(miss * length)) if own else []
    if deeper:
        # From depth 2 the state read is its own, at own + k for input token k + 1.
        read = mx.array([hidden + own + (j - 1) % length for j in deeper])
        fc[mx.array([own + (j + 1) % length for j in deeper]), read] = 2.0
    head.fc.weight = fc
    module: Any = head  # mlx leaves parameters() unannotated
    mx.eval(module.parameters())
    return MTPDraft(target, head)


def prompt(shape: str, repeats: int = 2) -> list[int]:
    """A prompt of the cycle, which the models continue."""
    length = cycle_length(shape)
    return [CYCLE_START + i for i in range(length)] * repeats


def parse_pair(spec: str) -> tuple[str, str]:
    """``"70b:1b"`` -> ``("70b", "1b")``; the draft may be :data:`HEAD`, the target's own.

    Raises:
        ValueError: Either shape is unknown; the message lists all shapes.
    """
    target, _, draft = spec.partition(":")
    for s in (target, draft) if draft != HEAD else (target,):
        if s not in SHAPES:
            raise ValueError(f"unknown shape '{s}' in '{spec}' (one of {', '.join(SHAPES)})")
    return target, draft
