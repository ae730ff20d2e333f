"""The life of the window's reply, outside the window.

:class:`ChatController` starts a reply for a conversation, collects its text
once (as runs by origin, which spell the text), saves it every
:data:`REPLY_SAVE_INTERVAL` seconds while it streams and once more when it
ends, and says what happened as signals that carry immutable values. The
window and the transcript only paint what it says.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

from app.engine.types import (
    DraftSetting,
    FinishReason,
    GenerationParams,
    Message,
    Origin,
    Reading,
    RoundStat,
    Segment,
    Stats,
    add_segments,
)
from app.services.engine_service import (
    EngineFailure,
    EngineService,
    GenerationResult,
    PairInfo,
    PromptProgress,
    ReplyHandle,
    ReplyQueued,
    TokenBatch,
)
from app.store import Store, StoredMessage

log = logging.getLogger(__name__)

# Seconds between saves of a streaming reply: a crash or kill keeps it up to its last save.
REPLY_SAVE_INTERVAL = 2.0


@dataclass(frozen=True, slots=True)
class Reply:
    """The reply in flight, as far as it got.

    Attributes:
        conversation_id: The conversation it answers in.
        request_id: The id the engine's batches, result and failure carry.
        parent_id: The message it follows, whatever branch is shown when it ends.
        message_id: Its row once saved while streaming, else ``None``.
        segments: Its text so far in runs by origin; they spell :attr:`text`.
        upto: The message a regenerated reply follows; what came after it is not shown.
        prompt_tokens: Tokens of its prompt, once the engine said; else ``None``.
        tokens: Tokens generated so far.
        stopping: Stop was asked for; the reply ends at the engine's next check.
        reading: How far the engine read the prompt, until the first tokens come.
        waiting: Replies the engine runs while this one waits for a place; 0
            once it started (or never waited).
    """

    conversation_id: int
    request_id: int
    parent_id: int | None
    message_id: int | None = None
    segments: tuple[Segment, ...] = ()
    upto: int | None = None
    prompt_tokens: int | None = None
    tokens: int = 0
    stopping: bool = False
    reading: Reading | None = None
    waiting: int = 0

    @property
    def text(self) -> str:
        """The reply's text so far."""
        return "".join(t for _, t in self.segments)

    @property
    def context_tokens(self) -> int | None:
        """Tokens of the target's window in use now; ``None`` until the prompt is counted."""
        return None if self.prompt_tokens is None else self.prompt_tokens + self.tokens


@dataclass(frozen=True, slots=True)
class ReplyGrowth:
    """New text of the reply, the rounds that wrote it and the context it fills now."""

    conversation_id: int
    segments: tuple[Segment, ...]
    rounds: tuple[RoundStat, ...]
    baseline_tps: float | None
    context_tokens: int | None = None  # None until the engine counted the prompt


@dataclass(frozen=True, slots=True)
class ReplyReading:
    """The engine reads the reply's prompt; no token has come yet."""

    conversation_id: int
    reading: Reading


@dataclass(frozen=True, slots=True)
class ReplyWaiting:
    """The reply waits for the engine: ``running`` replies (the server's) fill it; 0: it started."""

    conversation_id: int
    running: int


@dataclass(frozen=True, slots=True)
class ReplySaved:
    """The reply ended and was saved (``message`` is ``None`` when nothing was kept).

    Attributes:
        conversation_id: Where it was saved; the conversation still exists.
        message: The stored reply, or ``None`` (an error before any text).
        finish_reason: Why it ended.
        stats: Its numbers; ``None`` when it failed.
        branched: Whether it has siblings, so the branch switcher must show.
    """

    conversation_id: int
    message: StoredMessage | None
    finish_reason: FinishReason
    stats: Stats | None
    branched: bool


@dataclass(frozen=True, slots=True)
class ReplyEnded:
    """The reply is over, saved or not; the composer may send again.

    Attributes:
        request_id: The engine's id of the reply.
        stats: Its final numbers; ``None`` when it failed.
        context_tokens: Tokens of the target's window the conversation fills
            now; ``None`` when the engine never counted the prompt.
    """

    request_id: int
    stats: Stats | None
    context_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ReplyFailure:
    """The reply failed; ``message`` says why in one line."""

    conversation_id: int
    message: str


class ChatController(QObject):
    """Owns the window's reply: start, stream, partial and final saves, branches.

    Signals:
        started: A :class:`Reply`, just queued (nothing streamed yet).
        stopping: The :class:`Reply` Stop was asked for, once, before it ends.
        waiting: A :class:`ReplyWaiting` when the reply must wait for a place,
            and again (``running`` 0) when it starts.
        reading: A :class:`ReplyReading` as the prompt is read, before any token.
        grew: A :class:`ReplyGrowth` per batch the engine sends.
        saved: A :class:`ReplySaved` once the ended reply is in the store.
        ended: A :class:`ReplyEnded` when the reply is over, saved or not.
        failed: A :class:`ReplyFailure` after a failed reply was saved.
    """

    started = Signal(object)
    stopping = Signal(object)
    waiting = Signal(object)
    reading = Signal(object)
    grew = Signal(object)
    saved = Signal(object)
    ended = Signal(object)
    failed = Signal(object)

    def __init__(self, store: Store, service: EngineService, parent: QObject | None = None):
        super().__init__(parent)
        self._store = store
        self._service = service
        self._handle: ReplyHandle | None = None
        self._reply: Reply | None = None
        self._pair: PairInfo | None = None
        self._saved_at = 0.0
        self._saving = False
        service.generation_queued.connect(self._on_generation_queued)
        service.generation_started.connect(self._on_generation_started)
        service.prompt_progressed.connect(self._on_prompt_progressed)
        service.tokens_generated.connect(self._on_tokens_generated)
        service.generation_finished.connect(self._on_generation_finished)
        service.failed.connect(self._on_failed)

    @property
    def reply(self) -> Reply | None:
        """The reply in flight, or ``None``."""
        return self._reply

    @property
    def saving(self) -> bool:
        """Whether the store is being written with the reply (store changes it causes then).

        A view that repaints on store changes leaves these to the reply's own signals.
        """
        return self._saving

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        self._saving = True
        try:
            yield
        finally:
            self._saving = False

    @property
    def busy(self) -> bool:
        """Whether this controller's reply is queued or running."""
        return self._reply is not None

    def set_pair(self, pair: PairInfo | None) -> None:
        """The pair that writes replies, recorded with those saved while streaming."""
        self._pair = pair

    def history(self, conversation_id: int, upto: int | None = None) -> list[Message]:
        """The conversation as the model sees it: its system prompt, then the branch shown.

        Args:
            conversation_id: The conversation.
            upto: Stop after this message (to regenerate the reply that followed it).
        """
        conversation = self._store.conversation(conversation_id)
        out = []
        if conversation is not None and conversation.system_prompt:
            out.append(Message("system", conversation.system_prompt))
        for m in self._store.messages(conversation_id):
            out.append(Message(m.role, m.content))
            if m.id == upto:
                break
        return out

    def start(
        self, conversation_id: int, params: GenerationParams, parent_id: int | None = None
    ) -> Reply:
        """Asks the engine for the conversation's next reply.

        The engine keeps both models' caches, so only what follows the longest
        prefix it already holds is computed again, as after an edit.

        Args:
            conversation_id: The conversation.
            params: Sampling and drafting.
            parent_id: Regenerate the reply to this message; ``None``: answer the head.
        """
        conversation = self._store.conversation(conversation_id)
        head = conversation.head_id if conversation is not None else None
        messages = self.history(conversation_id, parent_id)
        self._handle = self._service.generate(messages, params)
        self._reply = Reply(
            conversation_id,
            self._handle.request_id,
            parent_id if parent_id is not None else head,
            upto=parent_id,
        )
        self._saved_at = time.monotonic()
        self.started.emit(self._reply)
        return self._reply

    def cancel(self) -> None:
        """Stops the reply; it ends as usual with what was written so far.

        ``stopping`` says so at once, since the engine acts on it only at its
        next check and the reply's end may come a moment later.
        """
        if self._handle is not None:
            self._handle.cancel()
        reply = self._reply
        if reply is not None and not reply.stopping:
            self._reply = reply = replace(reply, stopping=True)
            self.stopping.emit(reply)

    def set_drafting(self, setting: DraftSetting) -> None:
        """The reply in flight drafts as ``setting`` says from its next round."""
        if self._handle is not None:
            self._handle.set_drafting(setting)

    @Slot(object)
    def _on_generation_queued(self, queued: ReplyQueued) -> None:
        reply = self._reply
        if reply is None or queued.request_id != reply.request_id:
            return
        self._reply = replace(reply, waiting=max(queued.running, 1))
        self.waiting.emit(ReplyWaiting(reply.conversation_id, queued.running))

    @Slot(int)
    def _on_generation_started(self, request_id: int) -> None:
        reply = self._reply
        if reply is None or request_id != reply.request_id or not reply.waiting:
            return
        self._reply = replace(reply, waiting=0)
        self.waiting.emit(ReplyWaiting(reply.conversation_id, 0))

    @Slot(object)
    def _on_prompt_progressed(self, progress: PromptProgress) -> None:
        reply = self._reply
        if reply is None or progress.request_id != reply.request_id or reply.tokens:
            return
        self._reply = replace(reply, reading=progress.reading)
        self.reading.emit(ReplyReading(reply.conversation_id, progress.reading))

    @Slot(object)
    def _on_tokens_generated(self, batch: TokenBatch) -> None:
        reply = self._reply
        if reply is None or batch.request_id != reply.request_id:
            return
        prompt = reply.prompt_tokens if batch.prompt_tokens is None else batch.prompt_tokens
        self._reply = reply = replace(
            reply,
            segments=_joined(reply.segments, batch.segments),
            prompt_tokens=prompt,
            tokens=reply.tokens + len(batch.token_ids),
            reading=None,  # the prompt is read
        )
        self.grew.emit(
            ReplyGrowth(
                reply.conversation_id,
                batch.segments,
                batch.rounds,
                batch.baseline_tps,
                reply.context_tokens,
            )
        )
        if time.monotonic() - self._saved_at >= REPLY_SAVE_INTERVAL:
            self.save_partial()

    def save_partial(self, reason: FinishReason = "error") -> None:
        """Saves the reply streamed so far, marked ``reason`` until it ends.

        The first save adds it where the final save would; later ones replace
        its text. Should the app die, it reopens with the reply so far, marked
        as interrupted by an error; one the user stopped by quitting passes
        ``"cancelled"``.
        """
        self._saved_at = time.monotonic()
        reply = self._reply
        if reply is None or not reply.segments:
            return
        if self._store.conversation(reply.conversation_id) is None:
            return
        try:
            with self._writing():
                self._save_so_far(reply, reason)
        except (sqlite3.Error, ValueError) as exc:  # the final save tries again
            log.warning("cannot save the reply so far: %s", exc)

    def _save_so_far(self, reply: Reply, reason: FinishReason) -> None:
        """Adds the reply so far, or replaces its text once it was added."""
        if reply.message_id is None:
            saved = self._add(reply, self._pair, finish_reason=reason)
            self._reply = replace(reply, message_id=saved.id)
        else:
            self._store.update_message(
                reply.message_id,
                content=reply.text,
                finish_reason=reason,
                segments=reply.segments,
            )

    @Slot(object)
    def _on_generation_finished(self, result: GenerationResult) -> None:
        if self._reply is None or result.request_id != self._reply.request_id:
            return
        f = result.finished
        self._finish(f.finish_reason, result.pair, f.stats, f.origins)

    @Slot(object)
    def _on_failed(self, failure: EngineFailure) -> None:
        if failure.unloaded:  # out of memory: the engine dropped the pair
            self._pair = None
        reply = self._reply
        if failure.stage != "generate" or reply is None or failure.request_id != reply.request_id:
            return
        self._finish("error", self._pair, None, ())
        self.failed.emit(ReplyFailure(reply.conversation_id, failure.message))

    def _finish(
        self,
        reason: FinishReason,
        pair: PairInfo | None,
        stats: Stats | None,
        origins: tuple[Origin, ...],
    ) -> None:
        reply = self._reply
        assert reply is not None
        self._reply = None
        self._handle = None
        with self._writing():
            saved = self._save_final(reply, reason, pair, stats, origins)
        if saved is not None:
            self.saved.emit(saved)
        # A reply withdrawn before it ran has empty stats: its prompt was never counted.
        counted = stats is not None and stats.prompt_tokens > 0
        context = stats.context_tokens if stats is not None and counted else reply.context_tokens
        self.ended.emit(ReplyEnded(reply.request_id, stats, context))

    def _save_final(
        self,
        reply: Reply,
        reason: FinishReason,
        pair: PairInfo | None,
        stats: Stats | None,
        origins: tuple[Origin, ...],
    ) -> ReplySaved | None:
        """Writes the ended reply; what was saved (``None``: its chat is gone)."""
        cid = reply.conversation_id
        if self._store.conversation(cid) is None:  # deleted while it streamed
            return None
        saved = None
        details: dict[str, Any] = {"finish_reason": reason, "stats": stats, "origins": origins}
        if reply.message_id is not None and self._store.message(reply.message_id) is not None:
            # Saved while it streamed: it gets its final text and details.
            saved = self._store.update_message(
                reply.message_id, content=reply.text, segments=reply.segments, **details
            )
        elif reply.segments or reason != "error":
            saved = self._add(reply, pair, **details)
        branched = saved is not None and len(self._store.siblings(saved.id)) > 1
        return ReplySaved(cid, saved, reason, stats, branched)

    def _add(self, reply: Reply, pair: PairInfo | None, **details: Any) -> StoredMessage:
        """Adds the reply after the message it answers, with the pair that wrote it."""
        branch: dict[str, Any] = {} if reply.parent_id is None else {"parent_id": reply.parent_id}
        return self._store.add_message(
            reply.conversation_id,
            "assistant",
            reply.text,
            **branch,
            target=pair.target if pair else None,
            draft=pair.draft if pair else None,
            segments=reply.segments,
            **details,
        )


def _joined(segments: tuple[Segment, ...], more: tuple[Segment, ...]) -> tuple[Segment, ...]:
    """``segments`` followed by ``more``, with runs of one origin merged."""
    out = list(segments)
    add_segments(out, [t for _, t in more], [o for o, _ in more])
    return tuple(out)
