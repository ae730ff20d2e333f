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

GLM-4.5 / 4.6 / 4.7 (``glm4_moe``) and GLM-4.7-Flash (``glm4_moe_lite``) carry
the same head as DeepSeek-V3 files its "next-n" layer: the layer past the
model's own, ``model.layers.{n}.*``, with ``eh_proj``, ``enorm``, ``hnorm`` and
``shared_head.norm`` for ``fc``, the two input norms and ``norm``, its decoder
layer one of the model's own (a mixture of experts), norms stored as applied,
wired as above (mlx-vlm's ``GlmMoeDsaMTP``, vLLM's
``DeepSeekMultiTokenPredictorLayer``); so do DeepSeek-V3 (``deepseek_v3``), whose
layer's fp8 weights its model's ``sanitize`` dequantizes, and DeepSeek-V3.2 and
GLM-5 (``deepseek_v32``, ``glm_moe_dsa``), whose layer keeps its sparse attention's
indexer keys beside attention's (its cache made as its model's layers' are). Its layer's
tensors go through the model's own ``sanitize``, as a layer of the model's would.

MiMo (``mimo``) files one such layer as ``model.mtp_layers.0.*`` (``input_proj``,
``token_layernorm``, ``hidden_layernorm``, ``final_layernorm``) and wires it the
other way round (vLLM's ``MiMoMultiTokenPredictorLayer``): ``input_proj`` reads
the hidden state first, and the hidden state is the target's before its final
norm (vLLM's MiMo model returns it unnormed, its logits norm it).

MiMo-V2-Flash (``mimo_v2_flash``) files three such layers as ``model.mtp.layers.{i}.*``
(``eh_proj``, ``enorm``, ``hnorm``, ``final_layernorm``; ``pre_mlp_layernorm`` for
the block's second norm), each a sliding-window attention block with sinks and a
dense MLP, wired as DeepSeek-V3's (vLLM's ``MiMoV2FlashMTP``). Tandem drafts with
the first at every depth, as vLLM does with one; its attention keeps the model's
window.

Nemotron-H (``nemotron_h``) files its head under ``mtp.layers.*``: a run of the
model's own blocks (attention, then a mixture of experts: its config's
``mtp_hybrid_override_pattern``) with ``eh_proj``, ``enorm`` and ``hnorm`` on the
first and ``final_layernorm`` on the last, wired as above (mlx-vlm's
``NemotronHMTPDraftModel``); only its attention blocks keep a cache.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import CacheList, KVCache

from app.engine.loader import load_json, read_header, weight_files
from app.engine.recurrent import wrapped
from app.errors import ModelError

# Families whose head is filed as a layer past the model's own, DeepSeek-V3's way.
NEXT_N = frozenset({"glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "deepseek_v3", "deepseek_v32"})
_MIMO, _MIMO_V2, _NEMOTRON = "mimo", "mimo_v2_flash", "nemotron_h"
# The families whose MTP head Tandem drafts with (mlx-lm's model modules).
FAMILIES = frozenset({"qwen3_5", "qwen3_5_moe", "qwen3_next", _MIMO, _MIMO_V2, _NEMOTRON, *NEXT_N})
SUPPORTED = (
    "Qwen3.5 / 3.6, Qwen3-Next, GLM-4.5 / 4.6 / 4.7 / 4.7-Flash / 5, DeepSeek-V3 / V3.2, MiMo, "
    "MiMo-V2-Flash, Nemotron-H"
)
_PREFIX = "mtp."
_EMBEDDING, _INPUT = "embedding", "input"  # what a head zeroes at position 0


@dataclass(frozen=True)
class Filing:
    """Where a family's checkpoint files its MTP head, and how the head reads its inputs."""

    stem: str | None = None  # its tensors' prefix; None: Qwen's ``mtp.`` within the name
    # Its own modules (not its decoder layer's), stored name to name in MTPHead.
    names: dict[str, str] = field(default_factory=dict)
    hidden_first: bool = False  # ``fc`` reads [hidden; embedding], not [embedding; hidden]
    before_norm: bool = False  # the hidden state is the target's before its final norm
    numbered: bool = False  # the decoder layer is built with its index past the model's
    # Where its decoder layers' tensors go: its one layer's (layers.0.), or its own numbers.
    layer_prefix: str = "layers.0."
    pattern: str | None = None  # its blocks' kinds, where the model mixes them (Nemotron-H)
    one_plus: bool = False  # norms stored as w and applied as 1 + w (Qwen3.5's checkpoints)
    sliding: bool = False  # its block attends within the model's window (MiMo-V2-Flash's)
    # What is zeroed at position 0, as vLLM's layer of the family does: the token's
    # embedding (DeepSeek-V3's and GLM's next-n layers) or fc's output (MiMo's).
    first_zeroed: str | None = None
    first_only: bool = False  # of several layers, the first drafts at every depth


# A next-n layer's own modules, by their names in MTPHead (its decoder layer's are
# layers.0's); what else it repeats of the model (embedding, output head) is the target's.
# MiMo-V2-Flash's and Nemotron-H's heads read their inputs through the same three.
_NEXT_N_INPUTS = {"eh_proj": "fc", "enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden"}
_NEXT_N_NAMES = {**_NEXT_N_INPUTS, "shared_head.norm": "norm"}
_MIMO_V2_NAMES = {
    **_NEXT_N_INPUTS,
    "final_layernorm": "norm",
    "pre_mlp_layernorm": "layers.0.post_attention_layernorm",
}
_MIMO_NAMES = {
    "input_proj": "fc",
    "token_layernorm": "pre_fc_norm_embedding",
    "hidden_layernorm": "pre_fc_norm_hidden",
    "final_layernorm": "norm",
}


def filing(config: dict[str, Any]) -> Filing:
    """How the checkpoint of ``config``'s family files and wires its MTP head."""
    family = str(config.get("model_type", ""))
    if family in NEXT_N:
        layers = int(config.get("text_config", config)["num_hidden_layers"])
        return Filing(
            f"model.layers.{layers}.", _NEXT_N_NAMES, numbered=True, first_zeroed=_EMBEDDING
        )
    if family == _MIMO:
        return Filing(
            "model.mtp_layers.0.",
            _MIMO_NAMES,
            hidden_first=True,
            before_norm=True,
            first_zeroed=_INPUT,
        )
    if family == _MIMO_V2:
        return Filing("model.mtp.layers.0.", _MIMO_V2_NAMES, sliding=True, first_only=True)
    if family == _NEMOTRON:
        pattern = _nemotron_pattern(config)
        last = f"layers.{max(len(pattern), 1) - 1}.final_layernorm"
        names = {f"layers.0.{k}": v for k, v in _NEXT_N_INPUTS.items()}
        return Filing(_PREFIX, names | {last: "norm"}, layer_prefix="", pattern=pattern)
    return Filing(one_plus=True)


def _nemotron_pattern(config: dict[str, Any]) -> str:
    """Nemotron-H's MTP blocks, one letter a block as its hybrid_override_pattern has them."""
    pattern = config.get("mtp_hybrid_override_pattern")
    if isinstance(pattern, str):
        return pattern
    kinds = {"mamba": "M", "attention": "*", "moe": "E", "mlp": "-"}
    return "".join(kinds.get(str(t), "?") for t in config.get("mtp_layers_block_type") or ())


_REPEATED = ("embed_tokens.weight", "shared_head.head.weight")
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
    # Qwen's name, and DeepSeek-V3's, GLM-4.5's and MiMo's for their next-n layers.
    layers = text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers")
    return int(layers or 0)


def head_problem(folder: Path, config: dict[str, Any] | None = None) -> str | None:
    """Why the model at ``folder`` has no MTP head Tandem drafts with, in one line; ``None``
    where it has one. Its config (``config`` where given) and its weight files' headers
    are read, no tensor.
    """
    name = folder.name
    if config is None:
        try:  # the loader's reader: a FIFO in its place would hang the window's menus
            config = load_json(folder / "config.json", name)
        except (OSError, ModelError):
            config = None
    if config is None or not mtp_layers(config):
        return f"{name} carries no MTP head Tandem drafts with ({SUPPORTED})"
    family = str(config.get("model_type", ""))
    if family not in FAMILIES:
        return f"{name}: Tandem drafts with the MTP heads of {SUPPORTED}, not {family}'s"
    filed = filing(config)
    if filed.stem is not None and mtp_layers(config) > 1 and not filed.first_only:
        return f"{name}: Tandem drafts with one next-n layer, not {mtp_layers(config)}"
    if filed.pattern is not None and (not filed.pattern or set(filed.pattern) - {"*", "E", "-"}):
        return f"{name}: its MTP blocks ({filed.pattern or 'none named'}) are not ones Tandem runs"
    try:
        held = any(_own_name(key, filed) for f in weight_files(folder) for key in read_header(f))
    except ModelError:
        held = False
    if not held:
        # mlx-lm's converter (mlx-community's uploads) keeps the config and drops the layer.
        return (
            f"{name}'s weights leave out the MTP head its config names; `tandem models import` "
            "of its Hugging Face checkpoint keeps it"
        )
    return None


def has_head(folder: Path) -> bool:
    """Whether the model at ``folder`` carries an MTP head Tandem drafts with."""
    return head_problem(folder) is None


class MTPHead(nn.Module):
    """The MTP layers of a target, built from the target's own text model args.

    Args:
        target: The target model (mlx-lm's class of one of :data:`FAMILIES`).
        layers: MTP decoder layers (``mtp_num_hidden_layers``).
        pattern: The kinds of its blocks, where its family mixes them (Nemotron-H's
            ``mtp_hybrid_override_pattern``); one block of each letter, in order.
    """

    def __init__(self, target: nn.Module, layers: int = 1, pattern: str | None = None) -> None:
        super().__init__()
        text = text_model(target)
        args = text.args
        size = args.hidden_size
        eps = _eps(args)
        layer_class = type(_backbone(text).layers[0])
        family = getattr(target, "model_type", "")
        filed = filing({"model_type": family, "num_hidden_layers": args.num_hidden_layers})
        self.hidden_first, self.before_norm = filed.hidden_first, filed.before_norm
        self.first_zeroed = filed.first_zeroed
        self.fc = nn.Linear(2 * size, size, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(size, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(size, eps=eps)
        if pattern is not None:  # the model's own blocks, of the kinds named
            self.layers = [layer_class(args, kind) for kind in pattern]
        else:
            self.layers = [_layer(layer_class, args, filed, i) for i in range(layers)]
        # Blocks that keep a cache: all but a mixture's or an MLP's.
        self._cached = [getattr(b, "block_type", "*") not in ("E", "-") for b in self.layers]
        self.norm = nn.RMSNorm(size, eps=eps)
        # MLA attention (GLM-4.7-Flash) takes its mask as an array, as its model makes it.
        self._array_mask = hasattr(args, "kv_lora_rank")
        self._window = args.sliding_window_size if filed.sliding else None
        # A next-n layer's cache is of its model's layers' kind: DeepSeek-V3.2's indexer
        # keeps keys of its own beside attention's (a CacheList).
        made = text.make_cache() if filed.numbered and hasattr(text, "make_cache") else [None]
        self._empty_cache: Any = made[0] if made[0] is not None else KVCache()

    def make_cache(self) -> list[Any]:
        return [copy.deepcopy(self._empty_cache) for cached in self._cached if cached]

    def _input(self, embedded: mx.array, hidden: mx.array) -> mx.array:
        parts = [self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden)]
        return mx.concatenate(parts[::-1] if self.hidden_first else parts, axis=-1)

    def __call__(self, embedded: mx.array, hidden: mx.array, cache: Sequence[Any]) -> mx.array:
        """The head's output states (after its norm) for ``(1, n, size)`` token embeddings
        and the hidden states beside them, read into ``cache`` at its offset."""
        if self.first_zeroed == _EMBEDDING:
            embedded = _first_zeroed(embedded, cache[0])
        x = self.fc(self._input(embedded, hidden))
        if self.first_zeroed == _INPUT:
            x = _first_zeroed(x, cache[0])
        mask = create_attention_mask(
            x, attending(cache[0]), window_size=self._window, return_array=self._array_mask
        )
        caches = iter(cache)
        for layer, cached in zip(self.layers, self._cached, strict=True):
            x = layer(x, mask=mask, cache=next(caches) if cached else None)
        out: mx.array = self.norm(x)
        return out


def _first_zeroed(x: mx.array, cache: Any) -> mx.array:
    """``(batch, n, size)`` rows read into ``cache`` at its offset (each sequence's, in a
    batch), the row at position 0 zeroed."""
    start = attending(cache).offset
    if isinstance(start, int):
        return x if start > 0 else x.at[:, :1].multiply(0)
    positions = start.reshape(-1, 1) + mx.arange(x.shape[1])
    return mx.where((positions == 0)[..., None], mx.zeros_like(x), x)


def _eps(args: Any) -> float:
    """The model's RMSNorm epsilon, under any of its families' names."""
    for name in ("rms_norm_eps", "layer_norm_epsilon", "layernorm_epsilon"):
        if eps := getattr(args, name, None):
            return float(eps)
    raise ValueError("the model's args give no norm epsilon")


def attending(cache: Any) -> Any:
    """A head layer's attention cache: the first of a CacheList's (DeepSeek-V3.2's), as its
    model makes masks from."""
    return cache[0] if isinstance(cache, CacheList) else cache


def _layer(layer_class: type, args: Any, filed: Filing, i: int) -> nn.Module:
    """MTP decoder layer ``i``, one of the model's own kind."""
    if hasattr(args, "full_attention_interval"):  # Qwen's: every MTP layer attends
        layer: nn.Module = layer_class(replace(args, full_attention_interval=1), i)
    elif filed.sliding:  # MiMo-V2-Flash's: a dense MLP, attending within the window
        layer = layer_class(args, False, True)
    elif filed.numbered:  # a next-n layer: numbered past the model's, as its checkpoint files it
        layer = layer_class(args, args.num_hidden_layers + i)
    else:  # MiMo's blocks take no number
        layer = layer_class(args)
    return layer


def _backbone(text: Any) -> Any:
    """A text model's stack of layers between embedding and final norm (``model``, or
    Nemotron-H's ``backbone``)."""
    return _either(text, "model", "backbone")


def _embedding(text: Any) -> Any:
    return _either(_backbone(text), "embed_tokens", "embeddings")


def _either(module: Any, name: str, other: str) -> Any:
    """``module``'s child ``name``, or ``other`` where its family names it so (a module is
    a dict, so an empty one would read as missing to ``or``)."""
    child = getattr(module, name, None)
    return child if child is not None else getattr(module, other)


def logits(target: nn.Module, states: mx.array) -> mx.array:
    """The target's output head over ``states`` (the head's, or the target's own)."""
    text = text_model(target)
    lm_head = getattr(text, "lm_head", None)
    out: mx.array = lm_head(states) if lm_head is not None else _embedding(text).as_linear(states)
    return out


def hidden_and_logits(
    target: nn.Module, tokens: mx.array, cache: Sequence[Any], before_norm: bool = False
) -> tuple[mx.array, mx.array]:
    """A target forward of ``(1, n)`` tokens giving the state a head reads (its last layer's
    output after the final norm, or before it) beside the logits."""
    install(target)
    normed: mx.array = _backbone(text_model(target))(tokens, cache=cache)
    hidden: mx.array = _local.before if before_norm else normed
    return hidden, logits(target, normed)


def embed(target: nn.Module, tokens: mx.array) -> mx.array:
    """The target's embedding of ``tokens``: the head reads tokens through it."""
    out: mx.array = _embedding(text_model(target))(tokens)
    return out


# Rows of the target's output states kept behind what the head has read: a round's
# rows it may go back over and read again.
BEHIND = 64

_local = threading.local()


class HiddenRows:
    """The target's output states of one request's rows, kept for its MTP head to read.

    The last entry of a target's cache where the head drafts: mlx-lm's models
    zip their layers with the cache and leave it alone; the target's forward
    (:func:`install`) adds the rows it read, and it goes back with the other
    layers. Rows the head has read, but for :data:`BEHIND`, are let go.
    """

    def __init__(self, before_norm: bool = False) -> None:
        self.rows: mx.array | None = None  # positions [offset - kept, offset)
        self.offset = 0
        self.before_norm = before_norm  # keeps the states before the target's final norm

    @property
    def kept(self) -> int:
        return 0 if self.rows is None else int(self.rows.shape[1])

    def update(self, hidden: mx.array) -> None:
        self.rows = hidden if self.rows is None else mx.concatenate([self.rows, hidden], axis=1)
        self.offset += hidden.shape[1]

    def take(self, start: int, stop: int, like: mx.array) -> mx.array:
        """The states of positions [start, stop); zeros where none is kept (before the
        first position, let go): ``like`` gives their width and type."""
        first = self.offset - self.kept
        lo, hi = min(max(start, first), stop), min(stop, self.offset)
        parts = []
        if lo > start:
            parts.append(mx.zeros((1, lo - start, like.shape[-1]), like.dtype))
        if hi > lo and self.rows is not None:
            parts.append(self.rows[:, lo - first : hi - first])
        if stop > max(hi, lo):
            parts.append(mx.zeros((1, stop - max(hi, lo), like.shape[-1]), like.dtype))
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)

    def release(self, before: int) -> None:
        """Lets go of the states of positions before ``before``."""
        drop = before - (self.offset - self.kept)
        if drop > 0 and self.rows is not None:
            self.rows = self.rows[:, drop:] if drop < self.kept else None

    def trim(self, n: int) -> int:
        n = min(n, self.offset)
        self.offset -= n
        keep = self.kept - n
        self.rows = None if self.rows is None or keep <= 0 else self.rows[:, :keep]
        return n

    def is_trimmable(self) -> bool:
        return True

    @property
    def state(self) -> list[mx.array]:
        return [] if self.rows is None else [self.rows]

    @property
    def nbytes(self) -> int:
        return 0 if self.rows is None else int(self.rows.nbytes)


class MTPCache:
    """One request's MTP head caches, and the target's states it reads (:func:`link`)."""

    def __init__(self, kv: list[KVCache]) -> None:
        self.kv = kv
        self.rows: HiddenRows | None = None
        self.own: mx.array | None = None  # the head's output state at position offset - 1

    @property
    def offset(self) -> int:
        return int(attending(self.kv[0]).offset)

    def trim(self, n: int) -> int:
        for c in self.kv:
            c.trim(n)
        self.own = None
        return n

    def is_trimmable(self) -> bool:
        return True

    @property
    def state(self) -> list[Any]:
        return [c.state for c in self.kv]

    @property
    def nbytes(self) -> int:
        return sum(int(c.nbytes) for c in self.kv)


class MTPDraft(nn.Module):
    """A target's MTP head as a draft model: reading the token at position p, beside the
    target's output state at p - 1 (or its own, past what the target has read), it
    gives the logits of the token at p + 1, as a draft model does.

    Args:
        target: The target model; its forward is made to keep its output states
            (:func:`install`).
        head: The target's MTP layers, loaded.
    """

    model_type = "mtp"

    def __init__(self, target: nn.Module, head: MTPHead) -> None:
        super().__init__()
        self.head = head
        install(target)
        self._target = lambda: target  # not a child module: its weights are the target's

    def make_cache(self) -> list[Any]:
        return [MTPCache(self.head.make_cache())]

    def __call__(self, inputs: mx.array, cache: Sequence[Any] | None = None) -> mx.array:
        c = cache[0] if cache else MTPCache(self.head.make_cache())
        embedded, hidden = self.inputs(inputs, c)
        states = self.head(embedded, hidden, c.kv)
        return self.outputs(states, c)

    def inputs(self, tokens: mx.array, c: MTPCache) -> tuple[mx.array, mx.array]:
        """The head's inputs for ``(1, n)`` tokens read into ``c`` at its offset: their
        embeddings and the states beside them."""
        n, p = tokens.shape[1], c.offset
        embedded = embed(self._target(), tokens)
        rows = c.rows
        if n == 1 and (rows is None or p - 1 >= rows.offset) and c.own is not None:
            return embedded, c.own  # a drafted token: the state the head predicted it from
        if rows is not None:
            return embedded, rows.take(p - 1, p - 1 + n, embedded)
        return embedded, mx.zeros(embedded.shape, embedded.dtype)

    def outputs(self, states: mx.array, c: MTPCache) -> mx.array:
        """The logits of the head's ``(1, n, size)`` output states, read into ``c``."""
        c.own = states[:, -1:]
        if c.rows is not None:
            c.rows.release(c.offset - 1 - BEHIND)
        return logits(self._target(), states)


def target_rows(draft: nn.Module | None) -> list[HiddenRows]:
    """What a target's cache holds beyond its layers for ``draft``: the states an MTP head reads."""
    return [HiddenRows(draft.head.before_norm)] if isinstance(draft, MTPDraft) else []


def link(d_cache: Sequence[Any] | None, t_cache: Sequence[Any]) -> None:
    """Points a request's MTP cache at its target cache's states (nothing for a draft model)."""
    if d_cache and isinstance(d_cache[0], MTPCache) and isinstance(t_cache[-1], HiddenRows):
        d_cache[0].rows = t_cache[-1]


class _Captured(nn.RMSNorm):
    """A target's final norm: its input and output, the states a head reads, kept for the
    forward."""

    def __call__(self, x: mx.array) -> mx.array:
        out: mx.array = super().__call__(x)
        _local.before, _local.hidden = x, out
        return out


_KEEPING: dict[type, type] = {}


def _keeping(forward: Callable[..., Any], model: Any, *args: Any, **kwargs: Any) -> Any:
    """A target's forward, adding its output states to its cache's :class:`HiddenRows`."""
    cache = kwargs.get("cache", args[1] if len(args) > 1 else None)  # (inputs, cache)
    _local.hidden = None
    out = forward(model, *args, **kwargs)
    rows = cache[-1] if cache and isinstance(cache[-1], HiddenRows) else None
    if rows is not None and _local.hidden is not None:
        rows.update(_local.before if rows.before_norm else _local.hidden)
    return out


def install(target: nn.Module) -> None:
    """Makes ``target``'s forwards keep their output states where its cache asks."""
    norm = _either(_backbone(text_model(target)), "norm", "norm_f")  # Nemotron-H's: norm_f
    if type(norm) is nn.RMSNorm:
        norm.__class__ = _Captured
    target.__class__ = wrapped(type(target), _KEEPING, _keeping)


def _own_name(key: str, filed: Filing) -> str | None:
    """A checkpoint tensor's name in :class:`MTPHead`; ``None`` for the model's own."""
    stem = filed.stem
    if stem is None:
        return key[key.index(_PREFIX) + len(_PREFIX) :] if _PREFIX in key else None
    if not key.startswith(stem) or key.endswith(_REPEATED):
        return None
    tail = key[len(stem) :]
    module, _, leaf = tail.rpartition(".")
    own = filed.names.get(module)
    return f"{own}.{leaf}" if own else filed.layer_prefix + tail


def head_name(key: str, config: dict[str, Any]) -> str | None:
    """A checkpoint tensor's name in :class:`MTPHead`, for a model of ``config``'s family;
    ``None`` for the model's own, and for what the head repeats of it."""
    return _own_name(key, filing(config))


def stored_name(name: str, config: dict[str, Any]) -> str:
    """Where a head's tensor ``name`` (in :class:`MTPHead`) is stored in a folder of the
    family: under ``mtp.``, or in the layer of its own that mlx-lm drops at load."""
    filed = filing(config)
    if filed.stem is None:
        return _PREFIX + name
    stored = {v: k for k, v in filed.names.items()}
    module, _, leaf = name.rpartition(".")
    own = f"{stored[module]}.{leaf}" if module in stored else name.removeprefix(filed.layer_prefix)
    return filed.stem + own


def _sanitized(weights: dict[str, mx.array], target: nn.Module) -> dict[str, mx.array]:
    """A head's layers' tensors as mlx-lm's class holds the model's own (experts stacked,
    MLA's ``kv_b_proj`` split, fp8 dequantized): the model's ``sanitize`` run over them
    as its first layers', which it keeps. Tensors already in that layout pass as they are."""
    text = text_model(target)
    stack = "backbone." if hasattr(text, "backbone") else "model."  # where its layers are
    as_own = {stack + k: v for k, v in weights.items() if k.startswith("layers.")}
    done = text.sanitize(as_own)
    rest = {k: v for k, v in weights.items() if not k.startswith("layers.")}
    return rest | {k[len(stack) :]: v for k, v in done.items()}


def head_weights(
    folder: Path, config: dict[str, Any] | None = None, target: nn.Module | None = None
) -> dict[str, mx.array]:
    """The MTP tensors of a model folder, named as in :class:`MTPHead`, norms as applied.

    Only the headers of the weight files are read whole; tensors load from the
    files that hold MTP ones. A next-n family's head needs its ``target``, whose
    ``sanitize`` lays out its layer.

    Raises:
        ModelError: A weight file or the index is damaged.
        ValueError: A next-n family's head asked for without its target.
    """
    if config is None:
        config = load_json(folder / "config.json", folder.name)
    filed = filing(config)
    files = weight_files(folder)
    headers = {f: read_header(f) for f in files}
    # mlx-lm's own test for a Hugging Face checkpoint: convolutions not yet transposed.
    hugging_face = any(
        "conv1d.weight" in k and t.shape[-1] != 1 for h in headers.values() for k, t in h.items()
    )
    weights: dict[str, mx.array] = {}
    for path, header in headers.items():
        if not any(_own_name(k, filed) for k in header):
            continue
        loaded = mx.load(str(path))
        assert isinstance(loaded, dict)
        for key, value in loaded.items():
            if name := _own_name(key, filed):
                one = filed.one_plus and hugging_face and name.endswith(_NORMS) and value.ndim == 1
                weights[name] = value + 1.0 if one else value
    if filed.stem is None:
        return weights
    if target is None:
        raise ValueError("a next-n layer is laid out by its target's sanitize")
    return _sanitized(weights, target)


def head_layers(config: dict[str, Any]) -> int:
    """How many of a config's MTP layers its head runs a step (0: none)."""
    layers = mtp_layers(config)
    return min(layers, 1) if filing(config).first_only else layers


def head_of(target: nn.Module, config: dict[str, Any]) -> MTPHead:
    """An MTP head for ``target`` as its ``config`` shapes it, its weights not loaded."""
    return MTPHead(target, head_layers(config), filing(config).pattern)


def load_head(folder: Path, target: nn.Module, config: dict[str, Any]) -> MTPHead:
    """The MTP head of the target at ``folder``, its weights loaded, quantized as they are stored.

    Raises:
        ModelError: :func:`head_problem`'s line, where it has one.
    """
    problem = head_problem(folder, config)
    if problem is not None:
        raise ModelError(problem)
    name = folder.name
    weights = head_weights(folder, config, target)
    head = head_of(target, config)
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
    "BEHIND",
    "FAMILIES",
    "NEXT_N",
    "SUPPORTED",
    "Filing",
    "HiddenRows",
    "MTPCache",
    "MTPDraft",
    "MTPHead",
    "attending",
    "embed",
    "filing",
    "has_head",
    "head_layers",
    "head_name",
    "head_of",
    "head_problem",
    "head_weights",
    "hidden_and_logits",
    "install",
    "link",
    "load_head",
    "logits",
    "mtp_layers",
    "stored_name",
    "target_rows",
    "text_model",
]
