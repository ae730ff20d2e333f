"""The tokenizer: ``tokenizer.json`` and its configs rebuilt from GGUF metadata."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.errors import ModelError
from app.hub.gguf_import.common import _Metadata

# llama.cpp token types (tokenizer.ggml.token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


# Control tokens that end a turn although the metadata may name only one eos id.
_END_OF_TURN = frozenset({"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>"})


_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# Qwen3.5's: Qwen2's, with combining marks (\p{M}) kept in the letters they follow.
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# DeepSeek-V3's: three splits one after the other, digits, then Chinese and Japanese
# scripts, then the rest (llama.cpp's DEEPSEEK3_LLM, its tokenizer.json's Sequence).
_DEEPSEEK3_SPLITS = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)


# CJK ideographs, the scripts from Samaritan to them, and Hangul, as DeepSeek's splits have them.
_DEEPSEEK_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"


# DeepSeek-LLM's and DeepSeek-Coder's (llama.cpp's DEEPSEEK_LLM and DEEPSEEK_CODER, their
# tokenizer.json's Sequence): newlines apart, then letters, punctuation, CJK and digits in turn.
# Escapes, since an editor's NFC would turn the class's Ohm and Kelvin signs into Ω and K.
_DEEPSEEK_LLM_SPLITS = (
    r"[\r\n]",
    r"\s?["
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-"
    "\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-"
    "\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5"
    "\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00"
    "-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-"
    "\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-"
    "\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-"
    "\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
    "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13"
    "-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
    "]+",
    r"\s?[!-/:-~" "\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    _DEEPSEEK_CJK,
    r"\p{N}+",
)
_DEEPSEEK_CODER_SPLITS = (
    r"[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    _DEEPSEEK_CJK,
    r"\p{N}",
)


# Mistral's Tekken (Mistral Nemo, Small 3, Devstral), as its tokenizer.json has it: a word
# splits before each capital, digits one at a time.
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# OpenAI's o200k (gpt-oss), as llama.cpp's GPT4O regex has it: Tekken's words, each with an
# English contraction, and digits three at a time.
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# tokenizer.ggml.pre values that llama.cpp reads with GPT-2's regex; a file without the key
# gets it too. Any other name not below is refused, as llama.cpp refuses it: a wrong split
# would tokenize every prompt differently from the model's training, silently.
_GPT2_NAMES = frozenset({"default", "gpt-2", "gpt2", "phi-2", "roberta-bpe", "mpt", "olmo"})


# llama.cpp's StarCoder group (SmolLM, Granite's refact, Command R): every digit apart, then
# GPT-2's regex (no split regex of its own).
_DIGITS_THEN_GPT2 = frozenset({"smollm", "refact", "starcoder", "command-r"})


# The names llama.cpp reads as Llama 3's: its regex, whole pieces matched before merges,
# and BOS added where the file has no add_bos_token key.
_LLAMA3_NAMES = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}
)


# tokenizer.ggml.pre values (llama.cpp's names) whose split regexes are known.
_PRE_SPLITS: dict[str, str | tuple[str, ...]] = {
    **dict.fromkeys(_LLAMA3_NAMES, _LLAMA3_SPLIT),
    "dbrx": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "megrez": _QWEN2_SPLIT,
    "qwen35": _QWEN35_SPLIT,
    "glm4": _LLAMA3_SPLIT,  # llama.cpp's CHATGLM4 regex is Llama 3's, merges applied
    "chatglm-bpe": _LLAMA3_SPLIT,
    "deepseek-v3": _DEEPSEEK3_SPLITS,
    "deepseek-llm": _DEEPSEEK_LLM_SPLITS,
    "deepseek-coder": _DEEPSEEK_CODER_SPLITS,
    "tekken": _TEKKEN_SPLIT,
    "gpt-4o": _GPT4O_SPLIT,
}


# llama.cpp matches a whole pre-token against the vocabulary before merging for these.
_IGNORE_MERGES = _LLAMA3_NAMES | {"dbrx", "smaug-bpe", "tekken"}


@dataclass(frozen=True, slots=True)
class _TokenizerFiles:
    tokenizer_json: str
    tokenizer_config: dict[str, Any]
    generation_config: dict[str, Any]
    eos_token_id: int | list[int] | None
    bos_token_id: int | None


def _build_tokenizer(meta: _Metadata, arch_name: str, context: int, label: str) -> _TokenizerFiles:
    """``tokenizer.json`` and its companions, rebuilt from the ``tokenizer.ggml.*`` metadata."""
    from tokenizers import AddedToken, Tokenizer, processors

    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
        raise ModelError(f"{label}: no tokenizer in the file (tokenizer.ggml.model is missing)")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelError(f"{label}: no tokenizer in the file (tokenizer.ggml.tokens is missing)")
    types = meta.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise ModelError(f"{label}: tokenizer.ggml.token_type does not match the tokens")

    tokenizer: Tokenizer
    if kind == "gpt2":
        merges = meta.get("tokenizer.ggml.merges")
        if not merges:
            raise ModelError(f"{label}: tokenizer.ggml.merges is missing")
        pre = meta.get("tokenizer.ggml.pre")
        pre = pre if isinstance(pre, str) and pre not in _GPT2_NAMES else None
        if pre is not None and pre not in _PRE_SPLITS.keys() | _DIGITS_THEN_GPT2:
            raise ModelError(
                f"{label}: its pre-tokenizer '{pre}' is not supported yet; "
                "import the model's Hugging Face folder instead"
            )
        tokenizer = _byte_level_bpe(tokens, types, merges, pre)
        # As llama.cpp reads files without the key.
        add_bos_default = pre in _LLAMA3_NAMES or pre == "tekken"
    elif kind == "llama":
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None or len(scores) != len(tokens):
            raise ModelError(f"{label}: tokenizer.ggml.scores is missing")
        add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        gemma = arch_name.startswith("gemma")
        tokenizer = _sentencepiece_bpe(tokens, types, scores, gemma=gemma, add_prefix=add_prefix)
        add_bos_default = True
    else:
        raise ModelError(f"{label}: tokenizer type '{kind}' is not supported yet")

    # Control tokens become special added tokens, user-defined ones plain added tokens,
    # so that both are matched whole in text. Only tokens the model's vocabulary holds
    # under the same id are added: anything else would get a new id past the embeddings.
    special: list[AddedToken] = []
    user: list[AddedToken] = []
    for i, (t, ty) in enumerate(zip(tokens, types, strict=True)):
        if ty in (_CONTROL, _USER_DEFINED) and t and tokenizer.token_to_id(t) == i:
            is_special = ty == _CONTROL
            (special if is_special else user).append(
                AddedToken(t, lstrip=False, rstrip=False, normalized=False, special=is_special)
            )
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(user)

    def token_at(key: str) -> tuple[int | None, str | None]:
        value = meta.get(key)
        if not isinstance(value, int) or not 0 <= value < len(tokens):
            return None, None
        return value, tokens[value]

    bos_id, bos = token_at("tokenizer.ggml.bos_token_id")
    eos_id, eos = token_at("tokenizer.ggml.eos_token_id")
    pad_id, pad = token_at("tokenizer.ggml.padding_token_id")
    _unk_id, unk = token_at("tokenizer.ggml.unknown_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        single = " ".join([f"{bos}:0"] * add_bos + ["$A:0"] + [f"{eos}:0"] * add_eos)
        pair = single + " " + " ".join([f"{bos}:1"] * add_bos + ["$B:1"] + [f"{eos}:1"] * add_eos)
        specials = []
        if add_bos:
            specials.append((bos, bos_id))
        if add_eos and eos != bos:
            specials.append((eos, eos_id))
        tokenizer.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=specials
        )

    eos_ids: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        token_id, _ = token_at(f"tokenizer.ggml.{key}")
        if token_id is not None and token_id not in eos_ids:
            eos_ids.append(token_id)
    for i, (t, ty) in enumerate(zip(tokens, types, strict=True)):
        if ty == _CONTROL and t in _END_OF_TURN and i not in eos_ids:
            eos_ids.append(i)
    eos_value: int | list[int] | None = (
        None if not eos_ids else eos_ids[0] if len(eos_ids) == 1 else eos_ids
    )

    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "unk_token": unk,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "model_max_length": context,
        "clean_up_tokenization_spaces": False,
    }
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        tokenizer_config["chat_template"] = template
    generation = {
        k: v
        for k, v in (
            ("bos_token_id", bos_id),
            ("eos_token_id", eos_value),
            ("pad_token_id", pad_id),
        )
        if v is not None
    }
    return _TokenizerFiles(
        tokenizer_json=tokenizer.to_str(pretty=True),
        tokenizer_config=tokenizer_config,
        generation_config=generation,
        eos_token_id=eos_value,
        bos_token_id=bos_id,
    )


def _vocab(tokens: Sequence[str], types: Sequence[int]) -> dict[str, int]:
    """Token → id; a repeated token keeps its first id, as llama.cpp does.

    llama.cpp's converter fills embedding rows past the tokenizer with unused
    ``[PAD<id>]`` tokens; they are left out so that the vocabulary equals the
    original tokenizer's and pairs with models taken from the Hub.
    """
    vocab: dict[str, int] = {}
    for i, (t, ty) in enumerate(zip(tokens, types, strict=True)):
        if not (ty == _UNUSED and t == f"[PAD{i}]"):
            vocab.setdefault(t, i)
    return vocab


def _byte_level_bpe(
    tokens: Sequence[str], types: Sequence[int], merges: Sequence[str], pre: str | None
) -> Any:
    """GPT-2 style byte-level BPE, split the way the vocabulary's merges were learned."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if sep:
            pairs.append((left, right))
    tokenizer = Tokenizer(
        models.BPE(
            vocab=_vocab(tokens, types),
            merges=pairs,
            dropout=None,
            unk_token=None,
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=pre in _IGNORE_MERGES,
        )
    )
    split = _PRE_SPLITS.get(pre or "")
    if pre in _DIGITS_THEN_GPT2:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    elif split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        regexes = (split,) if isinstance(split, str) else split
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                *(
                    pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False)
                    for r in regexes
                ),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece_bpe(
    tokens: Sequence[str],
    types: Sequence[int],
    scores: Sequence[float],
    *,
    gemma: bool,
    add_prefix: bool,
) -> Any:
    """A SentencePiece BPE vocabulary as a ``tokenizers`` BPE with byte fallback.

    The file has scores but no merges; the merges are rebuilt from the
    vocabulary, best-scored result first, as transformers does.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    if gemma:
        # Gemma files spell runs of spaces as real spaces, and rank merges by file order.
        tokens = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in tokens]
        ranks: Sequence[float] = [-float(i) for i in range(len(tokens))]
    else:
        ranks = [float(s) for s in scores]
    vocab = _vocab(tokens, types)
    unk = next((t for t, ty in zip(tokens, types, strict=True) if ty == _UNKNOWN), None)
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=_spm_merges(tokens, types, ranks),
            dropout=None,
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    else:
        scheme = "first" if add_prefix else "never"
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="\u2581", prepend_scheme=scheme, split=False
        )
        if add_prefix:
            steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def _spm_merges(
    tokens: Sequence[str], types: Sequence[int], ranks: Sequence[float]
) -> list[tuple[str, str]]:
    """Every split of a text token into two text tokens, best-ranked result first.

    Text tokens are the normal and user-defined ones (Gemma's runs of spaces are
    user-defined and are reached by merging); control and byte tokens never
    come out of merging.
    """
    normal: dict[str, int] = {}
    for i, (t, ty) in enumerate(zip(tokens, types, strict=True)):
        if ty in (_NORMAL, _USER_DEFINED):
            normal.setdefault(t, i)
    found: list[tuple[float, int, int, int, int, str, str]] = []
    for token, token_id in normal.items():
        rank = ranks[token_id]
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            left_id, right_id = normal.get(left), normal.get(right)
            if left_id is not None and right_id is not None:
                found.append((-rank, -len(left), -len(right), left_id, right_id, left, right))
    found.sort()
    return [(f[5], f[6]) for f in found]
