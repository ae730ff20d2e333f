"""Streaming a chat reply as a generator of immutable events."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from types import FrameType
from typing import Any

from app.engine.batch_costs import BatchCosts, BatchProfile
from app.engine.costs import CostModel, CostProfile, ProfileStore
from app.engine.decoder import Decoder
from app.engine.loader import ModelPair
from app.engine.rounds import CacheError, DraftControl, Prefill, drafting_now
from app.engine.types import (
    Chunk,
    Finished,
    FinishReason,
    GenerationParams,
    InvalidTextError,
    Message,
    Origin,
    Reading,
    RoundStat,
    Stats,
    check_text,
)
from app.errors import ModelError, first_line

log = logging.getLogger(__name__)

DEFAULT_PARAMS = GenerationParams()
COUNT_CHUNK = 16_384  # characters tokenized at a time while sizing a long conversation
# A chat template renders in milliseconds; one still running after this loops on purpose.
TEMPLATE_SECONDS = 1.0


class PromptTooLongError(ModelError):
    """The conversation does not fit the target's context window (the caller's doing)."""


def _tokens_at_least(tokenizer: Any, texts: Sequence[str], limit: int) -> int:
    """A lower bound of the tokens of ``texts``, counted a chunk at a time up to ``limit``.

    Tokenizing a whole 16 MB prompt takes tens of seconds and gigabytes; chunks
    keep the tokenizer's memory small and stop as soon as the bound passes ``limit``.
    """
    total = 0
    # No chunk longer than the limit: tokenizers warn about a sequence over their window.
    chunk = max(min(COUNT_CHUNK, limit), 1)
    for text in texts:
        for start in range(0, len(text), chunk):
            ids = tokenizer.encode(text[start : start + chunk], add_special_tokens=False)
            # A cut may split one token in two: count one token fewer per chunk.
            total += max(len(ids) - 1, 0)
            if total >= limit:
                return total
    return total


def _check_texts(messages: Sequence[Message]) -> None:
    """Refuses text no tokenizer takes.

    Raises:
        ModelError: A message is not valid UTF-8 text.
    """
    for message in messages:
        try:
            check_text(message.content, f"the {message.role} message")
        except InvalidTextError as exc:
            raise ModelError(str(exc)) from None


def _too_long(tokens: str, name: str, window: int) -> PromptTooLongError:
    return PromptTooLongError(
        f"The conversation is {tokens} tokens, more than {name}'s window of {window:,}. "
        "Start a new chat, or delete earlier messages."
    )


class _TemplateTimeout(BaseException):
    """Raised into a template past its deadline; no ``except Exception`` on the way swallows it."""


def _render_bounded(render: Callable[[], Any], seconds: float) -> Any:
    """``render()``, stopped once it runs past ``seconds``.

    Every Python frame it enters, and every line of the template's own code
    (Jinja compiles it to Python), checks the deadline, so no loop in the
    template, however it is nested, runs on past it.

    Raises:
        _TemplateTimeout: It ran past ``seconds``.
    """
    deadline = time.monotonic() + seconds

    def on_line(frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise _TemplateTimeout
        return on_line

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise _TemplateTimeout
        # Jinja names the code it compiles from a string "<template>".
        return on_line if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        return render()
    finally:
        sys.settrace(previous)


def render_chat(tokenizer: Any, messages: Sequence[Message]) -> str:
    """The text of ``messages`` in the chat template, with a generation prompt.

    The template comes with the model, so it is untrusted: transformers renders
    it in Jinja's immutable sandbox, and this bounds its time and its recursion.

    Raises:
        ModelError: The chat template is unsafe, broken, recurses without end
            or runs longer than :data:`TEMPLATE_SECONDS`.
    """
    from jinja2.exceptions import TemplateError

    if not getattr(tokenizer, "has_chat_template", False):
        return "".join(f"{m.role}: {m.content}\n" for m in messages) + "assistant: "
    dicts = [m.as_dict() for m in messages]

    def render() -> Any:
        return tokenizer.apply_chat_template(dicts, add_generation_prompt=True, tokenize=False)

    why = "broken"
    try:
        text = _render_bounded(render, TEMPLATE_SECONDS)
    except _TemplateTimeout:
        why = f"looping (still rendering after {TEMPLATE_SECONDS:g} s)"
    except RecursionError:
        why = "looping (it recurses without end)"
    except MemoryError:
        why = "too large (rendering it ran out of memory)"
    except TemplateError as exc:  # SecurityError is one
        kind = "unsafe" if type(exc).__name__ == "SecurityError" else "broken"
        raise ModelError(f"the model's chat template is {kind} ({first_line(exc)})") from exc
    except Exception as exc:  # whatever else a template trips on, it is the template's
        why = f"broken ({type(exc).__name__}: {first_line(exc)})"
    else:
        if isinstance(text, str):
            return text
        why = f"broken (it rendered {type(text).__name__}, not text)"
    raise ModelError(f"the model's chat template is {why}") from None


def encode_chat(tokenizer: Any, messages: Sequence[Message]) -> list[int]:
    """Token ids of ``messages`` with the chat template and a generation prompt.

    The same ids as ``tokenizer.apply_chat_template`` gives; the template
    renders as :func:`render_chat` bounds it.

    Raises:
        ModelError: The chat template is unsafe, broken or never ends.
    """
    return _encode(tokenizer, render_chat(tokenizer, messages))


def _encode(tokenizer: Any, text: str) -> list[int]:
    """The ids of text :func:`render_chat` gave."""
    if not getattr(tokenizer, "has_chat_template", False):
        return list(tokenizer.encode(text))
    # The template writes any special tokens itself; transformers tokenizes it so too.
    return list(tokenizer.encode(text, add_special_tokens=False))


def prompt_ids(
    tokenizer: Any, messages: Sequence[Message], window: int | None, name: str
) -> list[int]:
    """The prompt of ``messages``, refused before it is tokenized whole when it cannot fit.

    The one rule for every path: the rendered text, which holds every message,
    is sized against ``window`` a chunk at a time when it has more characters
    than the window, so neither a long message nor a template that repeats it
    costs more than the window's worth of tokenizing before the refusal.

    Raises:
        PromptTooLongError: The conversation does not fit ``window``.
        ModelError: A message is not valid text, or the chat template fails.
    """
    _check_texts(messages)
    text = render_chat(tokenizer, messages)
    if window is not None and len(text) > window:
        at_least = _tokens_at_least(tokenizer, [text], window)
        if at_least >= window:
            raise _too_long(f"at least {at_least:,}", name, window)
    ids = _encode(tokenizer, text)
    if window is not None and len(ids) >= window:
        raise _too_long(f"{len(ids):,}", name, window)
    return ids


def reply_budget(prompt_tokens: int, max_tokens: int, window: int | None) -> int:
    """The tokens a reply may have: ``max_tokens``, capped at what the window leaves."""
    if window is None:
        return max_tokens
    return max(min(max_tokens, window - prompt_tokens), 0)


def new_decoder(pair: ModelPair, store: ProfileStore | None = None) -> Decoder:
    """The decoder of ``pair``: whoever keeps it keeps its caches across turns.

    Its cost models start from the pair's stored profiles on this machine,
    when there are some, and store them as rounds measure them.
    """
    draft = pair.draft.model if pair.draft is not None else None
    costs = cost_model_for(pair, store)
    return Decoder(pair.target.model, draft, costs, batch_costs_for(pair, costs, store))


def _stored_as(pair: ModelPair) -> tuple[str, str | None]:
    """The (target, draft) the profile store files ``pair``'s profiles under."""
    return str(pair.target.path), str(pair.draft.path) if pair.draft is not None else None


def cost_model_for(pair: ModelPair, store: ProfileStore | None = None) -> CostModel:
    """A cost model seeded from ``store`` (the default one when omitted) that saves to it."""
    store = store if store is not None else ProfileStore()
    target, draft = _stored_as(pair)
    warn = _warn_once(store)

    def save(profile: CostProfile) -> None:
        try:
            store.put(target, draft, profile)
        except OSError as exc:
            warn(exc)

    return CostModel(profile=store.get(target, draft), on_complete=save)


def _warn_once(store: ProfileStore) -> Callable[[OSError], None]:
    """Says in one line, once, that ``store`` cannot be written; the reply goes on.

    Not storing costs a re-measurement in a later process, nothing more.
    """
    warned = False

    def warn(exc: OSError) -> None:
        nonlocal warned
        if not warned:
            warned = True
            reason = exc.strerror or first_line(exc)
            log.warning("could not store cost profiles in %s (%s)", store.path, reason)

    return warn


def batch_costs_for(
    pair: ModelPair, single: CostModel, store: ProfileStore | None = None
) -> BatchCosts:
    """The pair's batched-round costs, seeded from ``store``, saved to it as shapes are measured."""
    store = store if store is not None else ProfileStore()
    target, draft = _stored_as(pair)
    raw = store.entry(target, draft, kind="batch")
    try:
        profile = BatchProfile.from_dict(raw) if raw is not None else None
    except (KeyError, TypeError, ValueError):
        profile = None  # unreadable: measured afresh

    warn = _warn_once(store)

    def save(batch: BatchProfile) -> None:
        try:
            store.put_entry(target, draft, batch.as_dict(), kind="batch")
        except OSError as exc:
            warn(exc)

    return BatchCosts(single, profile, on_measured=save)


def stream_reply(
    pair: ModelPair,
    messages: Sequence[Message],
    params: GenerationParams = DEFAULT_PARAMS,
    cancel: threading.Event | None = None,
    control: DraftControl | None = None,
    *,
    decoder: Decoder | None = None,
    prompt: Sequence[int] | None = None,
) -> Iterator[Reading | Chunk | Finished]:
    """Streams the target's reply to ``messages``.

    Yields a :class:`Reading` before each chunk of the prompt the target reads
    (none when its cache holds the prompt already), one :class:`Chunk` per
    round (its text may be empty while a multi-byte character is incomplete)
    and ends with one :class:`Finished`.
    ``cancel`` is checked before every round, between prompt chunks and
    between draft steps; ``control`` changes the draft length from the next
    round on. ``decoder`` (from :func:`new_decoder`) holds the caches: pass
    the same one for every turn of a conversation to reuse what they hold, and
    for every reply at once to share its rounds with the others pulled in
    turn. ``prompt``
    is ``messages`` as :func:`prompt_ids` gave them for this pair, when the
    caller prepared them on its own thread (the engine thread then does not).

    Raises:
        PromptTooLongError: The conversation does not fit the target's window.
        ModelError: The pair cannot serve the request (for example drafting
            with a target whose cache cannot be rewound), or a message is not
            valid text.
    """
    start = time.perf_counter()
    tokenizer = pair.target.tokenizer
    window = pair.target.context_length
    given = (
        list(prompt)
        if prompt is not None
        else prompt_ids(tokenizer, messages, window, pair.target.name)
    )
    # Prompt and reply share the window: the reply stops where it ends.
    budget = reply_budget(len(given), params.max_tokens, window)
    capped = budget < params.max_tokens
    if capped:
        params = replace(params, max_tokens=budget)  # no round drafts past the window
    eos = set(tokenizer.eos_token_ids)
    detok = tokenizer.detokenizer
    detok.reset()
    if decoder is None:
        decoder = new_decoder(pair)  # a one-off reply: nothing to reuse
    rounds = decoder.generate(given, params, control, cancel, reading=True)
    token_ids: list[int] = []
    origins: list[Origin] = []
    drafted = accepted = lookup_accepted = calls = draft_rounds = 0
    draft_seconds = verify_seconds = prompt_seconds = ttft = 0.0
    reused = 0
    ks: list[int] = []
    reason: FinishReason = "length"
    try:
        while len(token_ids) < params.max_tokens:
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            try:
                rnd = next(rounds, None)
            except CacheError as exc:
                raise ModelError(f"{pair.target.name}: {exc}") from exc
            if rnd is None:  # the decoder saw the cancel inside a round
                reason = "cancelled"
                break
            if isinstance(rnd, Reading):
                yield rnd
                continue
            if isinstance(rnd, Prefill):
                prompt_seconds, reused = rnd.seconds, rnd.reused_tokens
                continue
            if calls == 0:
                ttft = time.perf_counter() - start
            calls += 1
            draft_seconds += rnd.draft_seconds
            verify_seconds += rnd.seconds - rnd.draft_seconds
            ids, orig = list(rnd.tokens), list(rnd.origins)
            stop = next((i for i, t in enumerate(ids) if t in eos), None)
            room = params.max_tokens - len(token_ids)
            # An end past the budget is never reached: plain decoding stops at the budget first.
            if stop is not None and stop < room:
                ids, orig = ids[:stop], orig[:stop]
                reason = "stop"
            ids, orig = ids[:room], orig[:room]
            # Drafts past the reply's end were never part of it: neither drafted nor accepted.
            k, kept = min(rnd.k, len(ids)), min(rnd.accepted, len(ids))
            if k:
                draft_rounds += 1
                drafted += k
                accepted += kept
                lookup_accepted += orig.count(Origin.LOOKUP)
                ks.append(rnd.k)
            pieces = []
            for t in ids:
                detok.add_token(t)
                pieces.append(detok.last_segment)
            token_ids += ids
            origins += orig
            if ids:
                stat = RoundStat(
                    tokens=len(ids),
                    k=k,
                    accepted=kept,
                    lookup=orig.count(Origin.LOOKUP),
                    seconds=rnd.seconds,
                    draft_seconds=rnd.draft_seconds,
                    auto=rnd.auto,
                )
                text, baseline = "".join(pieces), decoder.baseline_tps
                yield Chunk(
                    text, tuple(ids), tuple(orig), tuple(pieces), stat, baseline, len(given)
                )
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
        prompt_tokens=len(given),
        reused_tokens=reused,
        tokens=len(token_ids),
        drafted=drafted,
        accepted=accepted,
        lookup_accepted=lookup_accepted,
        target_calls=calls,
        draft_rounds=draft_rounds,
        # The setting in force at the end: the slider may have moved mid-reply.
        num_draft=drafting_now(params, control).num_draft
        if (pair.draft is not None or params.prompt_lookup)
        else 0,
        k_min=min(ks, default=0),
        k_sum=sum(ks),
        k_max=max(ks, default=0),
        prompt_seconds=prompt_seconds,
        generation_seconds=max(end - start - prompt_seconds, 0.0),
        ttft_seconds=ttft,
        draft_seconds=draft_seconds,
        verify_seconds=verify_seconds,
        baseline_tps=decoder.baseline_tps,
        capped_by_window=capped and reason == "length",
    )
    yield Finished(stats, reason, tuple(token_ids), tuple(origins))
