"""Whether a draft model can draft for a target, judged without loading weights.

The checks read configs, tokenizers and safetensors headers, and build the
mlx-lm model objects lazily (their random initial weights are never evaluated)
to see which KV caches they use, so a pair of large models is judged in well
under a second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.engine.loader import (
    LoadProgress,
    ModelPair,
    config_model,
    is_model_file,
    load_json,
    load_pair,
    own_head,
    user_path,
)
from app.engine.mtp import head_problem
from app.errors import IncompatiblePairError, ModelError, first_line
from app.hub.library import ModelInfo, hub_repo_id, human_count, inspect_model

# A draft should be this much smaller than its target for speculation to pay off.
# Past it the pair only gets a warning: size never makes a pair incompatible, since
# a larger draft still gives the target's exact reply and can still pay (Qwen2.5-Coder
# 0.5B is 35% of 1.5B and gives 1.1-1.45x on a CPU; a 4-bit copy of a bf16 target
# has all its parameters at a quarter of the bytes).
_GOOD_DRAFT_SHARE = 0.25
# The library suggests only drafts up to this share of the target: one barely
# smaller is accepted when chosen, but is rarely what anyone wants offered.
_SUGGESTED_DRAFT_SHARE = 0.5
# How many differing tokens a detail names before it stops.
_NAMED = 3
_ROLES = (("bos", "beginning-of-sequence"), ("eos", "end-of-sequence"), ("pad", "padding"))


@dataclass(frozen=True, slots=True)
class Check:
    """One pair check and its outcome.

    Attributes:
        name: Short name of what was checked, e.g. ``"vocabulary size"``.
        ok: Whether the pair passed.
        detail: One line: what was found.
        required: Whether failing makes the pair incompatible; a failed check
            that is not required is a warning.
    """

    name: str
    ok: bool
    detail: str
    required: bool = True


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of every check of a target and draft pair."""

    target: ModelInfo
    draft: ModelInfo
    checks: tuple[Check, ...]

    @property
    def compatible(self) -> bool:
        """Whether every required check passed."""
        return all(c.ok for c in self.checks if c.required)

    @property
    def suggested(self) -> bool:
        """Whether to offer the draft for the target: compatible, at most half its size."""
        t, d = self.target.parameters, self.draft.parameters
        if not t or d is None:
            return False
        return self.compatible and d <= _SUGGESTED_DRAFT_SHARE * t

    @property
    def reasons(self) -> tuple[str, ...]:
        """The details of the failed required checks."""
        return tuple(c.detail for c in self.checks if not c.ok and c.required)

    @property
    def warnings(self) -> tuple[str, ...]:
        """The details of the failed checks that do not make the pair incompatible."""
        return tuple(c.detail for c in self.checks if not c.ok and not c.required)


@dataclass(frozen=True, slots=True)
class _Vocab:
    """A tokenizer reduced to what the checks compare."""

    tokens: tuple[str | None, ...]  # the text of every id; None where an id is unused
    added: frozenset[str]  # added and special tokens

    def text(self, token_id: int) -> str | None:
        return self.tokens[token_id] if 0 <= token_id < len(self.tokens) else None


@dataclass(frozen=True, slots=True)
class _Side:
    """One model of the pair with the files the checks read."""

    role: str  # "target" or "draft"
    info: ModelInfo
    config: dict[str, Any]
    tok_config: dict[str, Any]
    eos_ids: tuple[int, ...]
    vocab: _Vocab


def check_pair(target: Path, draft: Path | str) -> Verdict:
    """Checks whether ``draft`` can draft for ``target``, without loading weights.

    Args:
        target: The target model folder.
        draft: The draft model folder, or the target's own MTP head
            (:func:`~app.engine.loader.own_head`).

    Returns:
        Every check with its outcome; :attr:`Verdict.compatible` sums them up.

    Raises:
        ModelError: A folder is not a usable model; the message is one line.
    """
    t = _side("target", user_path(target))
    if own_head(draft):
        return _own_head(t)
    d = _side("draft", user_path(Path(draft)))
    checks = (
        _check_vocab_size(t, d),
        _check_token_texts(t, d),
        _check_special_tokens(t, d),
        _check_added_tokens(t, d),
        _check_caches(t, d),
        _check_draft_size(t, d),
        _check_chat_templates(t, d),
    )
    return Verdict(target=t.info, draft=d.info, checks=checks)


def _own_head(t: _Side) -> Verdict:
    """The target drafting with its own MTP head: it pairs by construction, where it has one."""
    problem = head_problem(t.info.path)
    detail = problem or "the target drafts with its own multi-token-prediction head"
    head = replace(t.info, name="its own MTP head", parameters=None)
    return Verdict(target=t.info, draft=head, checks=(Check("MTP head", not problem, detail),))


def refusal(v: Verdict) -> str | None:
    """The one sentence every caller refuses an incompatible pair with; ``None`` if it is not.

    ``check-pair``, ``tandem generate``, ``tandem serve`` and the window all say
    exactly this, so a pair is refused in the same words wherever it is tried.
    """
    if v.compatible:
        return None
    return f"{v.draft.name} cannot draft for {v.target.name}: " + "; ".join(v.reasons)


def require_compatible(target: Path, draft: Path | str) -> Verdict:
    """:func:`check_pair`, raising for an incompatible pair; the loaders' pair check.

    Raises:
        IncompatiblePairError: The pair is incompatible; the message is :func:`refusal`'s.
        ModelError: A folder is not a usable model.
    """
    verdict = check_pair(target, draft)
    sentence = refusal(verdict)
    if sentence is not None:
        raise IncompatiblePairError(sentence)
    return verdict


def load_checked_pair(
    target: Path | str,
    draft: Path | str | None = None,
    *,
    fuse: bool = True,
    progress: Callable[[LoadProgress], None] | None = None,
    loaded: ModelPair | None = None,
) -> ModelPair:
    """:func:`~app.engine.loader.load_pair` that refuses what ``check-pair`` refuses.

    A model of ``loaded`` (the pair in memory) that the new pair names again is kept.

    Raises:
        ModelError: A folder cannot be loaded.
        IncompatiblePairError: The pair is incompatible, in :func:`refusal`'s words.
    """
    return load_pair(
        target, draft, fuse=fuse, progress=progress, check=require_compatible, loaded=loaded
    )


def format_verdict(v: Verdict) -> str:
    """Renders a verdict for the terminal: the outcome, then one line per check."""
    head = "compatible" if v.compatible else f"incompatible: {refusal(v)}"
    if v.compatible and v.warnings:
        head += " (warning: " + "; ".join(v.warnings) + ")"
    lines = [head]
    for c in v.checks:
        mark = "✓" if c.ok else ("✗" if c.required else "!")
        lines.append(f"  {mark} {c.name}: {c.detail}")
    return "\n".join(lines)


def _side(role: str, path: Path) -> _Side:
    repo_id = hub_repo_id(path)
    if repo_id is None:
        info = inspect_model(path)
    else:
        info = inspect_model(path, source="hf-cache", repo_id=repo_id, name=repo_id)
    if info.problem is not None:
        raise ModelError(info.problem)
    config = _read_json(path / "config.json", info.name)
    tok_config = _read_json(path / "tokenizer_config.json", info.name, missing_ok=True)
    # mlx-lm lets generation_config.json override the config's end-of-sequence ids.
    generation = _read_json(path / "generation_config.json", info.name, missing_ok=True)
    eos_ids = _ids(generation.get("eos_token_id")) or _ids(config.get("eos_token_id"))
    return _Side(role, info, config, tok_config, eos_ids, _load_vocab(path, info.name))


def _read_json(file: Path, name: str, *, missing_ok: bool = False) -> dict[str, Any]:
    # The loader's rule: a FIFO or a link to a device in its place is refused, not read.
    if missing_ok and not is_model_file(file, name):
        return {}
    try:
        return load_json(file, name)
    except OSError as exc:
        raise ModelError(f"{name}: {file.name} is unreadable ({first_line(exc)})") from exc


def _load_vocab(path: Path, name: str) -> _Vocab:
    try:
        if (path / "tokenizer.json").is_file():
            return _vocab_from_tokenizers(path / "tokenizer.json")
        return _vocab_from_transformers(path)
    except Exception as exc:  # both libraries raise many kinds for broken files
        raise ModelError(f"{name}: cannot read the tokenizer ({first_line(exc)})") from exc


def _vocab_from_tokenizers(file: Path) -> _Vocab:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(file))
    ids = tok.get_vocab(with_added_tokens=True).values()
    # Ids can have gaps, so the largest id, not the count, bounds the range.
    size = max(max(ids, default=-1) + 1, tok.get_vocab_size(with_added_tokens=True))
    tokens = tuple(tok.id_to_token(i) for i in range(size))
    added = frozenset(t.content for t in tok.get_added_tokens_decoder().values())
    return _Vocab(tokens, added)


def _vocab_from_transformers(path: Path) -> _Vocab:
    """Reads a SentencePiece-only tokenizer (``tokenizer.model``) through transformers."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    tokens = tuple(tok.convert_ids_to_tokens(list(range(len(tok)))))
    added = {t.content for t in tok.added_tokens_decoder.values()}
    return _Vocab(tokens, frozenset(added | set(tok.all_special_tokens)))


def _check_vocab_size(t: _Side, d: _Side) -> Check:
    name = "vocabulary size"
    t_size, d_size = _vocab_size(t.config), _vocab_size(d.config)
    for side, size in ((t, t_size), (d, d_size)):
        if size is None:
            return Check(name, False, f"the {side.role}'s config.json names no vocab_size")
    if t_size == d_size:
        return Check(name, True, f"both {t_size}")
    # Checkpoints pad their embeddings differently (Qwen2.5 7B 152064 rows, 0.5B
    # 151936); rows past the tokenizer's tokens are never proposed, so padding is fine.
    tokens = max(len(t.vocab.tokens), len(d.vocab.tokens))
    assert t_size is not None and d_size is not None
    if min(t_size, d_size) < tokens:
        return Check(name, False, f"vocabulary sizes differ ({t_size} vs {d_size})")
    return Check(
        name, True, f"{t_size} vs {d_size} rows, padding past the {tokens} tokens they share"
    )


def _check_token_texts(t: _Side, d: _Side) -> Check:
    name = "token texts"
    size = max(len(t.vocab.tokens), len(d.vocab.tokens))
    differing = [i for i in range(size) if t.vocab.text(i) != d.vocab.text(i)]
    if not differing:
        return Check(name, True, f"all {size} token ids match")
    first = differing[0]
    return Check(
        name,
        False,
        f"{len(differing)} of {size} token ids differ; the first is id {first}: "
        f"{_show(t.vocab.text(first))} vs {_show(d.vocab.text(first))}",
    )


def _check_special_tokens(t: _Side, d: _Side) -> Check:
    differences = []
    for role, words in _ROLES:
        t_texts, d_texts = _special(t, role), _special(d, role)
        if t_texts != d_texts:
            differences.append(f"{words} tokens differ ({_shown(t_texts)} vs {_shown(d_texts)})")
    if differences:
        return Check("special tokens", False, "; ".join(differences))
    found = [f"{role} {_shown(_special(t, role))}" for role, _ in _ROLES]
    return Check("special tokens", True, "same " + ", ".join(found))


def _check_added_tokens(t: _Side, d: _Side) -> Check:
    name = "added tokens"
    only_t, only_d = t.vocab.added - d.vocab.added, d.vocab.added - t.vocab.added
    if not only_t and not only_d:
        return Check(name, True, f"the same {len(t.vocab.added)}")
    parts = [
        f"only the {side.role} has {_listed(only)}"
        for side, only in ((t, only_t), (d, only_d))
        if only
    ]
    return Check(name, False, "added tokens differ: " + "; ".join(parts))


def _check_caches(t: _Side, d: _Side) -> Check:
    name = "cache rewind"
    refused = []
    for side in (t, d):
        try:
            why = _cache_refusal(side.config)
        except Exception as exc:  # mlx-lm model classes reject odd configs in many ways
            return Check(name, False, f"cannot build the {side.role}'s model ({first_line(exc)})")
        if why is not None:
            refused.append(f"the {side.role} ({side.info.name}) cannot rewind its cache: {why}")
    if not refused:
        return Check(name, True, "both caches can be rewound")
    return Check(name, False, "; ".join(refused))


def _check_draft_size(t: _Side, d: _Side) -> Check:
    name = "draft size"
    t_params, d_params = t.info.parameters, d.info.parameters
    if not t_params or d_params is None:
        return Check(name, False, "the parameter counts are unknown", required=False)
    share = d_params / t_params
    sizes = f"{human_count(d_params)} vs {human_count(t_params)} parameters"
    if share > _GOOD_DRAFT_SHARE:
        return Check(
            name,
            False,
            f"the draft is {share:.0%} of the target ({sizes}); under "
            f"{_GOOD_DRAFT_SHARE:.0%} speeds up more",
            required=False,
        )
    return Check(name, True, f"the draft is {share:.0%} of the target ({sizes})")


def _check_chat_templates(t: _Side, d: _Side) -> Check:
    missing = [s.role for s in (t, d) if not s.info.has_chat_template]
    if not missing:
        return Check("chat template", True, "both have one")
    if len(missing) == 2:
        return Check("chat template", False, "neither model has a chat template")
    return Check("chat template", False, f"the {missing[0]} has no chat template")


def _cache_refusal(config: dict[str, Any]) -> str | None:
    """Builds the model object lazily, never evaluating it, to ask whether its caches go back."""
    from app.engine.caches import refusal

    return refusal(config_model(config))


def _vocab_size(config: dict[str, Any]) -> int | None:
    text_config = config.get("text_config")
    for section in (config, text_config if isinstance(text_config, dict) else {}):
        value = section.get("vocab_size")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _special(side: _Side, role: str) -> frozenset[str]:
    """The texts of a role's token from tokenizer_config.json and the config's ids."""
    texts = set()
    text = _token_text(side.tok_config.get(f"{role}_token"))
    if text:
        texts.add(text)
    ids = side.eos_ids if role == "eos" else _ids(side.config.get(f"{role}_token_id"))
    for token_id in ids:
        texts.add(side.vocab.text(token_id) or f"id {token_id}")
    return frozenset(texts)


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json writes a token as text or as a serialised AddedToken.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return ()


def _show(text: str | None) -> str:
    return "(none)" if text is None else repr(text)


def _shown(texts: frozenset[str]) -> str:
    return ", ".join(repr(t) for t in sorted(texts)) or "none"


def _listed(texts: frozenset[str]) -> str:
    names = ", ".join(repr(t) for t in sorted(texts)[:_NAMED])
    more = len(texts) - _NAMED
    return f"{names} and {more} more" if more > 0 else names
