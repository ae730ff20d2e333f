"""Streaming a chat reply as a generator of immutable events."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import mlx.core as mx

from app.engine.loader import ModelPair
from app.engine.speculative import speculative_rounds
from app.engine.types import Chunk, Finished, FinishReason, GenerationParams, Message, Origin, Stats

DEFAULT_PARAMS = GenerationParams()


def encode_chat(tokenizer: object, messages: Sequence[Message]) -> list[int]:
    """Token ids of ``messages`` with the chat template and a generation prompt."""
    dicts = [m.as_dict() for m in messages]
    if getattr(tokenizer, "has_chat_template", False):
        ids = tokenizer.apply_chat_template(dicts, add_generation_prompt=True)  # type: ignore[attr-defined]
        return list(ids)
    text = "".join(f"{m.role}: {m.content}\n" for m in messages) + "assistant: "
    return list(tokenizer.encode(text))  # type: ignore[attr-defined]


def stream_reply(
    pair: ModelPair,
    messages: Sequence[Message],
    params: GenerationParams = DEFAULT_PARAMS,
    cancel: threading.Event | None = None,
) -> Iterator[Chunk | Finished]:
    """Streams the target's reply to ``messages``.

    Yields one :class:`Chunk` per round (possibly with empty text while a
    multi-byte character is incomplete) and ends with one :class:`Finished`.
    ``cancel`` is checked before every round.
    """
    start = time.perf_counter()
    tokenizer = pair.target.tokenizer
    prompt = encode_chat(tokenizer, messages)
    if params.seed is not None:
        mx.random.seed(params.seed)
    eos = set(tokenizer.eos_token_ids)
    detok = tokenizer.detokenizer
    detok.reset()
    k = params.num_draft if pair.draft is not None else 0
    rounds = speculative_rounds(
        pair.target.model,
        prompt,
        draft=pair.draft.model if pair.draft is not None else None,
        num_draft=k,
        temperature=params.temperature,
    )
    token_ids: list[int] = []
    origins: list[Origin] = []
    drafted = accepted = calls = 0
    prompt_seconds = ttft = 0.0
    reason: FinishReason = "length"
    try:
        while len(token_ids) < params.max_tokens:
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            rnd = next(rounds)
            if not rnd.tokens:
                prompt_seconds = time.perf_counter() - start
                continue
            if calls == 0:
                ttft = time.perf_counter() - start
            calls += 1
            drafted += rnd.drafted
            accepted += rnd.accepted
            ids, orig = list(rnd.tokens), list(rnd.origins)
            stop = next((i for i, t in enumerate(ids) if t in eos), None)
            if stop is not None:
                ids, orig = ids[:stop], orig[:stop]
                reason = "stop"
            room = params.max_tokens - len(token_ids)
            ids, orig = ids[:room], orig[:room]
            for t in ids:
                detok.add_token(t)
            token_ids += ids
            origins += orig
            if ids:
                yield Chunk(detok.last_segment, tuple(ids), tuple(orig))
            if reason == "stop":
                break
    finally:
        rounds.close()
    detok.finalize()
    tail = detok.last_segment
    if tail:
        yield Chunk(tail, (), ())
    end = time.perf_counter()
    stats = Stats(
        prompt_tokens=len(prompt),
        tokens=len(token_ids),
        drafted=drafted,
        accepted=accepted,
        target_calls=calls,
        num_draft=k,
        prompt_seconds=prompt_seconds,
        generation_seconds=max(end - start - prompt_seconds, 0.0),
        ttft_seconds=ttft,
    )
    yield Finished(stats, reason, tuple(token_ids), tuple(origins))
