"""A target's own multi-token-prediction head: a drafter that needs no second model.

Qwen3.5 / 3.6 / 3.8 and Qwen3-Next checkpoints carry ``mtp_num_hidden_layers``
(one) MTP layers under ``mtp.*``, which mlx-lm drops at load. From the target's
hidden state ``h`` at position t and the token x(t+1) the head predicts x(t+2):

    x = fc([pre_fc_norm_embedding(embed(x(t+1))); pre_fc_norm_hidden(h)])
    x = layer(x)            # a full-attention decoder layer with its own KV cache
    logits = lm_head(norm(x))

the embedding first, the target's embedding and output head shared. Chained
to depth k, each step feeds the head its own output (after ``norm``) and its
own token. Its attention's positions are those of the hidden states it
reads: the pair (x(t+1), h(t)) sits at position t, so its cache holds the
rows of positions 0, 1, ... as the target's does.

The target hands over its last layer's output after the final norm, the
state its own head reads, as mlx-vlm's Qwen MTP drafter takes it: a forward of
the target's text model gives it, and the logits are its head over it
(:func:`hidden_and_logits`).

In Hugging Face checkpoints every RMSNorm weight, the head's too, is stored as
w and applied as 1 + w; mlx-lm adds the 1 to the backbone's where it sees
such a checkpoint (its convolutions not yet transposed), and so does
:func:`load_head` to the head's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from app.engine.loader import read_header, weight_files
from app.errors import ModelError

# The families whose MTP wiring is the one above (mlx-lm's model modules).
FAMILIES = frozenset({"qwen3_5", "qwen3_5_moe", "qwen3_next"})
_PREFIX = "mtp."
_NORMS = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "q_norm.weight",
    "k_norm.weight",
    "norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)


def text_model(target: nn.Module) -> Any:
    """The target's text model: the module holding ``model`` (embedding, layers, norm) and args."""
    return getattr(target, "language_model", target)


def mtp_layers(config: dict[str, Any]) -> int:
    """How many MTP layers a config's checkpoint carries (0: none)."""
    text = config.get("text_config", config)
    return int(text.get("mtp_num_hidden_layers", 0) or 0)


class MTPHead(nn.Module):
    """The MTP layers of a target, built from the target's own text model args.

    Args:
        target: The target model (mlx-lm's class of one of :data:`FAMILIES`).
        layers: MTP decoder layers (``mtp_num_hidden_layers``).
    """

    def __init__(self, target: nn.Module, layers: int = 1) -> None:
        super().__init__()
        text = text_model(target)
        args = text.args
        size, eps = args.hidden_size, args.rms_norm_eps
        layer_class = type(text.model.layers[0])
        full = replace(args, full_attention_interval=1)  # every MTP layer attends
        self.fc = nn.Linear(2 * size, size, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(size, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(size, eps=eps)
        self.layers = [layer_class(full, 0) for _ in range(layers)]
        self.norm = nn.RMSNorm(size, eps=eps)

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def __call__(self, embedded: mx.array, hidden: mx.array, cache: Sequence[Any]) -> mx.array:
        """The head's output states (after its norm) for ``(1, n, size)`` token embeddings
        and the hidden states beside them, read into ``cache`` at its offset."""
        x = mx.concatenate(
            [self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden)], axis=-1
        )
        x = self.fc(x)
        mask = create_attention_mask(x, cache[0])
        for layer, c in zip(self.layers, cache, strict=True):
            x = layer(x, mask=mask, cache=c)
        out: mx.array = self.norm(x)
        return out


def logits(target: nn.Module, states: mx.array) -> mx.array:
    """The target's output head over ``states`` (the head's, or the target's own)."""
    text = text_model(target)
    lm_head = getattr(text, "lm_head", None)
    out: mx.array = (
        lm_head(states) if lm_head is not None else text.model.embed_tokens.as_linear(states)
    )
    return out


def hidden_and_logits(
    target: nn.Module, tokens: mx.array, cache: Sequence[Any]
) -> tuple[mx.array, mx.array]:
    """A target forward of ``(1, n)`` tokens giving the state the head reads beside the logits."""
    hidden: mx.array = text_model(target).model(tokens, cache=cache)
    return hidden, logits(target, hidden)


def embed(target: nn.Module, tokens: mx.array) -> mx.array:
    """The target's embedding of ``tokens``: the head reads tokens through it."""
    out: mx.array = text_model(target).model.embed_tokens(tokens)
    return out


def head_weights(folder: Path) -> dict[str, mx.array]:
    """The MTP tensors of a model folder, named as in :class:`MTPHead`, norms as applied.

    Only the headers of the weight files are read whole; tensors load from the
    files that hold MTP ones.

    Raises:
        ModelError: A weight file or the index is damaged.
    """
    files = weight_files(folder)
    headers = {f: read_header(f) for f in files}
    # mlx-lm's own test for a Hugging Face checkpoint: convolutions not yet transposed.
    hugging_face = any(
        "conv1d.weight" in k and t.shape[-1] != 1 for h in headers.values() for k, t in h.items()
    )
    weights: dict[str, mx.array] = {}
    for path, header in headers.items():
        if not any(_PREFIX in k for k in header):
            continue
        loaded = mx.load(str(path))
        assert isinstance(loaded, dict)
        for key, value in loaded.items():
            if _PREFIX in key:
                name = key[key.index(_PREFIX) + len(_PREFIX) :]
                one = hugging_face and name.endswith(_NORMS) and value.ndim == 1
                weights[name] = value + 1.0 if one else value
    return weights


def load_head(folder: Path, target: nn.Module, config: dict[str, Any]) -> MTPHead:
    """The MTP head of the target at ``folder``, its weights loaded, quantized as they are stored.

    Raises:
        ModelError: The model carries no MTP head, or Tandem has no wiring for its family.
    """
    name = folder.name
    family = str(config.get("model_type", ""))
    layers = mtp_layers(config)
    if family not in FAMILIES:
        raise ModelError(
            f"{name}: Tandem drafts with MTP heads of Qwen3.5 / 3.6 and Qwen3-Next only"
        )
    weights = head_weights(folder) if layers else {}
    if not weights:
        raise ModelError(f"{name} carries no multi-token-prediction (MTP) head")
    head = MTPHead(target, layers)
    quantization = config.get("quantization")
    if quantization and any(k.endswith(".scales") for k in weights):
        nn.quantize(
            head,
            group_size=quantization["group_size"],
            bits=quantization["bits"],
            class_predicate=lambda path, _: f"{path}.scales" in weights,
        )
    try:
        head.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelError(f"{name}: its MTP head's weights do not fit: {exc}") from exc
    mx.eval(head.parameters())
    return head


__all__ = [
    "FAMILIES",
    "MTPHead",
    "embed",
    "head_weights",
    "hidden_and_logits",
    "load_head",
    "logits",
    "mtp_layers",
    "text_model",
]
