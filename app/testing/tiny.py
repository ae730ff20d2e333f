"""Tiny random-weight models in the Hugging Face layout.

They back the tests, ``tandem --self-test`` and offline demos: a real byte-level
BPE tokenizer trained with ``tokenizers`` plus an mlx-lm model class with random
weights, saved exactly as a Hub snapshot would be.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

_CORPUS = (
    "Tandem is a private chat app. A small draft model proposes tokens and the large "
    "target model verifies them in one pass, so the reply is exactly the target's own. "
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i * i)\n"
    "The quick brown fox jumps over the lazy dog. Hello, world! How are you today? "
    "Summarise the following text in one sentence. Write a haiku about the sea. "
    "user assistant system You are a helpful assistant. 0123456789 () [] {} <> = + - * /"
)


def train_tokenizer(out_dir: Path, vocab_size: int = 384, corpus: Iterable[str] = ()) -> None:
    """Trains a byte-level BPE tokenizer with a ChatML template into ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [_CORPUS, *corpus]
    tok.train_from_iterator(texts * 4, trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "model_max_length": 4096,
        "chat_template": CHATML_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def model_config(
    model_type: str = "llama",
    vocab_size: int = 384,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
) -> dict[str, Any]:
    """Returns a Hub-style ``config.json`` for a tiny model."""
    config: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [
            {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}.get(model_type, "")
        ],
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "intermediate_size": intermediate_size,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "eos_token_id": 2,
    }
    return config


def build_model(
    out_dir: Path,
    config: dict[str, Any] | None = None,
    *,
    seed: int = 0,
    tokenizer_from: Path | None = None,
    weights_from: Path | None = None,
    noise: float = 0.0,
) -> Path:
    """Writes a random-weight model folder in the Hugging Face layout.

    Args:
        out_dir: Folder to create.
        config: ``config.json`` contents; :func:`model_config` when omitted.
        seed: Seed of the random weights.
        tokenizer_from: Folder whose tokenizer files are copied; a new tokenizer
            is trained when omitted.
        weights_from: Folder whose weights are copied (a draft that mirrors its
            target), optionally perturbed by ``noise``.
        noise: Standard deviation of Gaussian noise added to copied weights.

    Returns:
        ``out_dir``.
    """
    from mlx_lm.utils import _get_classes

    config = dict(config or model_config())
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_from is None:
        train_tokenizer(out_dir, vocab_size=config["vocab_size"])
    else:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (out_dir / name).write_bytes((tokenizer_from / name).read_bytes())
    tok = json.loads((out_dir / "tokenizer.json").read_text())
    config["eos_token_id"] = tok["model"]["vocab"]["<|im_end|>"]

    mx.random.seed(seed)
    if weights_from is not None:
        weights = mx.load(str(weights_from / "model.safetensors"))
        assert isinstance(weights, dict)
        if noise:
            weights = {k: v + noise * mx.random.normal(v.shape) for k, v in weights.items()}
    else:
        model_class, args_class = _get_classes(config)
        model = model_class(args_class.from_dict(config))
        # Wider than the default init so random logits are peaked, not flat.
        params = tree_map(lambda p: p * 4.0 if p.ndim == 2 else p, model.parameters())
        weights = dict(tree_flatten(params))
    mx.eval(weights)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir
