"""The chat on show: the conversation the transcript shows, sending, Stop and the reply.

The reply's life is :class:`ChatController`'s; this part of the window picks
the conversation to show, asks for replies and paints what the controller
says of the one streaming: its text, the live figures and the context used.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from PySide6.QtCore import Slot

from app.engine.costs import K_MAX
from app.engine.types import GenerationParams
from app.services import Reply, ReplyEnded, ReplyFailure, ReplyGrowth, ReplyReading, ReplySaved
from app.store import StoreChange
from app.ui.composer import STOPPING_TEXT
from app.ui.pair_loading import LOAD_FIRST
from app.ui.transcript_style import finish_note, reading_note

if TYPE_CHECKING:
    from PySide6.QtWidgets import QMainWindow

    from app.engine.live import LiveStats
    from app.services import ChatController, EngineService
    from app.store import Settings, Store
    from app.ui.chat_list import ChatList
    from app.ui.composer import Composer
    from app.ui.model_bar import ModelBar
    from app.ui.pair_loading import PairLoading
    from app.ui.speculation_panel import SpeculationPanel
    from app.ui.statusbar import StatusBar
    from app.ui.transcript import TranscriptView
    from app.ui.tune_flow import TuneFlow

    _Window = QMainWindow
else:
    _Window = object


class ChatViewMixin(_Window):
    """The main window's chat on show and the reply streaming into it."""

    if TYPE_CHECKING:
        store: Store
        service: EngineService
        chat: ChatController
        tune: TuneFlow
        live: LiveStats
        chats: ChatList
        transcript: TranscriptView
        composer: Composer
        model_bar: ModelBar
        panel: SpeculationPanel
        status: StatusBar
        _settings: Settings
        pair_loading: PairLoading
        _conversation_id: int | None
        _pending_system_prompt: str | None
        _context_used: int | None
        _context_idle: int

        def show_error(self, message: str) -> None: ...
        def hide_error(self) -> None: ...
        def _save_settings(self, **changes: object) -> None: ...

    # Choosing the chat

    @Slot()
    def _on_new_conversation_requested(self) -> None:
        self._conversation_id = None
        self.chats.clear_selection()
        self.transcript.show_messages([])
        self._update_context(0)
        self.composer.focus()

    @Slot(int)
    def _on_conversation_selected(self, cid: int) -> None:
        if cid != self._conversation_id:
            self._show_conversation(cid)

    @Slot(int, int)
    def _on_search_hit_selected(self, cid: int, message_id: int) -> None:
        reply = self.chat.reply
        streaming_here = reply is not None and reply.conversation_id == cid
        shown = {m.id for m in self.store.messages(cid)}
        # The hit may be on another branch: that branch comes on screen, unless a
        # reply streams into the branch shown.
        if message_id not in shown and not streaming_here:
            with contextlib.suppress(ValueError):  # deleted since the search ran
                self.store.switch_branch(message_id)
        self._show_conversation(cid)
        self.transcript.highlight_message(message_id)

    @Slot(object)
    def _on_store_changed(self, change: StoreChange) -> None:
        """Repaints the chat on show when what it shows changed (a message, the branch).

        The reply's own saves are left to the reply's signals: it paints itself as
        it streams, and its end is painted once it is saved.
        """
        cid = self._conversation_id
        if change.kind != "messages" or cid is None or cid not in change.conversation_ids:
            return
        reply = self.chat.reply
        if self.chat.saving or (reply is not None and reply.conversation_id == cid):
            return
        self._show_conversation(cid)

    def _show_conversation(self, conversation_id: int, upto: int | None = None) -> None:
        self._conversation_id = conversation_id
        reply = self.chat.reply
        streaming = (
            reply if reply is not None and reply.conversation_id == conversation_id else None
        )
        # The streaming reply, saved so far, is shown below as it streams.
        messages = [
            m
            for m in self.store.messages(conversation_id)
            if reply is None or m.id != reply.message_id
        ]
        if upto is not None:  # a regenerated reply replaces what followed its prompt
            ids = [m.id for m in messages]
            messages = messages[: ids.index(upto) + 1] if upto in ids else messages
        self.transcript.show_messages(messages, self.store.branches(conversation_id))
        last = next((m.stats for m in reversed(messages) if m.stats is not None), None)
        self._context_idle = last.context_tokens if last else 0
        # While a reply streams here, the context is the reply's, not the last one saved.
        self._context_used = self._context_idle if streaming is None else streaming.context_tokens
        self._update_context()
        if streaming is not None:
            self.transcript.begin_reply()
            if streaming.reading is not None:
                self.transcript.show_reading(reading_note(streaming.reading))
            self.transcript.append_segments(streaming.segments)

    def _update_context(self, used: int | None = None) -> None:
        """Shows how much of the target's window the conversation fills."""
        if used is not None:
            self._context_used = used
        pair = self.pair_loading.pair
        window = pair.context_length if pair is not None else None
        self.status.context.show_usage(self._context_used, window)

    # Sending and the reply

    def params(self) -> GenerationParams:
        """What the window's replies are asked with: the settings and the bars' choices."""
        s = self._settings
        return GenerationParams(
            max_tokens=s.max_tokens,
            temperature=self.model_bar.temperature(),
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p,
            repetition_penalty=s.repetition_penalty,
            seed=s.seed,
            num_draft=self.panel.num_draft(),
            k_max=K_MAX,  # Auto may plan as far as the slider reaches
            prompt_lookup=self.model_bar.uses_lookup(),
        )

    @Slot(str)
    def _on_send_requested(self, text: str) -> None:
        if self.service.busy:
            return
        if self.pair_loading.pair is None:
            self.show_error(LOAD_FIRST)
            return
        self.hide_error()
        if self._conversation_id is None:
            title = " ".join(text.split())[:48]
            conversation = self.store.create_conversation(
                title, system_prompt=self._pending_system_prompt
            )
            self._conversation_id = conversation.id
        cid = self._conversation_id
        self.store.add_message(cid, "user", text)
        self.composer.clear()
        self._start_reply(cid)
        self._save_settings(
            num_draft=self.panel.fixed_k(),
            auto_draft=self.panel.auto_draft(),
            prompt_lookup=self.model_bar.uses_lookup(),
            temperature=self.model_bar.temperature(),
        )

    def _start_reply(self, cid: int, parent_id: int | None = None) -> None:
        """Asks for the conversation's next reply; :meth:`_on_reply_started` shows it."""
        self.chat.start(cid, self.params(), parent_id)

    @Slot()
    def _on_stop_requested(self) -> None:
        self._stop_own_work()

    def _stop_own_work(self) -> None:
        """Stops the window's reply and calibration; the server's replies run on."""
        self.chat.cancel()
        self.tune.cancel()

    @Slot(object)
    def _on_reply_started(self, reply: Reply) -> None:
        self.chats.select(reply.conversation_id)
        self._show_conversation(reply.conversation_id, upto=reply.upto)  # begins the reply
        self.composer.set_busy(True)
        self.live.begin_message()
        # Nothing of the last reply stays on show: this one's figures come as it streams.
        snapshot = self.live.snapshot()
        self.status.show_live(snapshot)
        self.panel.show_live(snapshot)

    @Slot(object)
    def _on_reply_stopping(self, _reply: Reply) -> None:
        # The engine stops at its next check; until the end arrives, say Stop was heard.
        self.composer.show_stopping()
        self.status.showMessage(STOPPING_TEXT)

    @Slot(object)
    def _on_reply_reading(self, reading: ReplyReading) -> None:
        if self._conversation_id == reading.conversation_id:
            self.transcript.show_reading(reading_note(reading.reading))

    @Slot(object)
    def _on_reply_grew(self, growth: ReplyGrowth) -> None:
        if self._conversation_id == growth.conversation_id:
            self.transcript.append_segments(growth.segments)
            self._context_used = growth.context_tokens
            self._update_context()
        # Batches arrive at most about 30 times a second: one repaint each.
        self.live.add(growth.rounds, growth.baseline_tps)
        auto_k = next((r.k for r in reversed(growth.rounds) if r.auto and r.k), None)
        if auto_k is not None:
            self.panel.show_auto_k(auto_k)
        snapshot = self.live.snapshot()
        self.status.show_live(snapshot)
        self.panel.show_live(snapshot)

    @Slot(object)
    def _on_reply_saved(self, saved: ReplySaved) -> None:
        cid = saved.conversation_id
        if cid != self._conversation_id:
            return
        self.chats.select(cid)
        if saved.branched:
            self._show_conversation(cid)  # shows the new branch's switcher
            return
        message_id = saved.message.id if saved.message is not None else None
        stats_id = message_id if saved.stats is not None else None
        note = finish_note(saved.finish_reason, saved.stats)
        self.transcript.end_reply(note, stats_id, message_id=message_id)

    @Slot(object)
    def _on_reply_ended(self, ended: ReplyEnded) -> None:
        self.composer.set_busy(False)
        if self.status.currentMessage() == STOPPING_TEXT:
            self.status.clearMessage()
        if ended.stats is not None:
            # The final figures replace the live ones, in the panel as in the status bar.
            self.live.finish_message(ended.stats)
            self.panel.show_live(self.live.snapshot())
            self.status.show_reply_stats(ended.stats)
        used = ended.context_tokens
        self._context_used = self._context_idle if used is None else used
        self._update_context()

    @Slot(object)
    def _on_reply_failed(self, failure: ReplyFailure) -> None:
        self.show_error(failure.message)
