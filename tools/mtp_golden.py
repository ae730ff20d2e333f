"""Records what mlx-vlm's Qwen3.5 MTP drafter computes on tiny random weights, for
tests/engine/test_mtp.py to check Tandem's head against.

mlx-vlm pulls in transformers, datasets, opencv, mlx-audio and more, so it is no
test dependency: this script reads an unpacked mlx-vlm wheel with none of them
(only Pillow beside the project's own environment), skipping its package
``__init__`` files, which import the rest.

    pip download --no-deps mlx-vlm==0.7.10 -d /tmp/w && unzip -q /tmp/w/mlx_vlm-*.whl -d /tmp/vlm
    pip install --target /tmp/pydeps pillow
    python tools/mtp_golden.py /tmp/vlm /tmp/pydeps tests/engine/data/mtp_golden.safetensors

The file holds the head's weights (mlx-vlm's names, norms as applied), the
target's embedding and output head, the inputs (5 tokens, 5 hidden states),
the logits at depth 1 over the 5 positions, and the logits of 3 chained steps
after them (each step fed its own output state and its own greedy token).
Its metadata holds the text config and the mlx-vlm version.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

VOCAB, SIZE = 384, 64
TEXT: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "hidden_size": SIZE,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "vocab_size": VOCAB,
    "max_position_embeddings": 4096,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
    "tie_word_embeddings": False,
    "mtp_num_hidden_layers": 1,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0],  # a text position is the same on all three axes
        "mrope_interleaved": True,
    },
}


def _mlx_vlm(wheel: Path, deps: Path) -> types.ModuleType:
    sys.path.insert(0, str(deps))
    root = wheel / "mlx_vlm"
    for name, sub in (
        ("mlx_vlm", ""),
        ("mlx_vlm.models", "models"),
        ("mlx_vlm.speculative", "speculative"),
        ("mlx_vlm.speculative.drafters", "speculative/drafters"),
    ):
        module = types.ModuleType(name)
        module.__path__ = [str(root / sub)]
        sys.modules[name] = module
    return importlib.import_module("mlx_vlm.speculative.drafters.qwen3_5_mtp")


def _flat(module: nn.Module) -> list[tuple[str, mx.array]]:
    return cast(list[tuple[str, mx.array]], tree_flatten(module.parameters()))


def main(wheel: Path, deps: Path, out: Path) -> None:
    mtp = _mlx_vlm(wheel, deps)
    version = next(wheel.glob("mlx_vlm-*.dist-info")).name.split("-")[1].removesuffix(".dist")
    mx.random.seed(7)
    drafter = mtp.Model(mtp.ModelConfig.from_dict({"text_config": TEXT}))
    # What the drafter binds to: the target's embedding and output head.
    target = types.SimpleNamespace(
        embed_tokens=nn.Embedding(VOCAB, SIZE), lm_head=nn.Linear(SIZE, VOCAB, bias=False)
    )
    # Norms away from one, so that a norm applied to the wrong input shows.
    params = [(k.removesuffix(".weight"), p) for k, p in _flat(drafter)]
    norms = [
        (k, mx.random.uniform(0.5, 1.5, p.shape)) for k, p in params if k.endswith("norm.weight")
    ]
    drafter.load_weights([(f"{k}.weight", p) for k, p in norms], strict=False)
    mx.eval(drafter.parameters(), target.embed_tokens.weight, target.lm_head.weight)
    drafter.reset(target)

    tokens = mx.array([[5, 17, 101, 250, 33]], dtype=mx.int32)
    hidden = mx.random.normal((1, 5, SIZE))
    states = drafter._forward_tokens(tokens, hidden, mx.int32)
    depth1 = target.lm_head(states)
    chained, state = [], states[:, -1:]
    token = mx.argmax(depth1[:, -1:], axis=-1)
    for _ in range(3):
        state = drafter._forward_tokens(token, state, mx.int32)
        step = target.lm_head(state)
        chained.append(step)
        token = mx.argmax(step, axis=-1)
    arrays = {f"head.{k}": v for k, v in _flat(drafter)}
    arrays.update(
        {
            "embed_tokens.weight": target.embed_tokens.weight,
            "lm_head.weight": target.lm_head.weight,
            "tokens": tokens,
            "hidden": hidden,
            "depth1": depth1,
            "chained": mx.concatenate(chained, axis=1),
        }
    )
    mx.save_safetensors(
        str(out), arrays, metadata={"text_config": json.dumps(TEXT), "mlx_vlm": version}
    )
    print(f"wrote {out}: {len(arrays)} arrays, mlx-vlm {version}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python tools/mtp_golden.py MLX_VLM_DIR DEPS_DIR OUT.safetensors")
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
