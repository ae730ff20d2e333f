"""The chat on show: the conversation the transcript shows, sending, Stop and the reply.

The reply's life is :class:`ChatController`'s; :class:`ChatView` picks the
conversation to show, asks for replies and paints what the controller says of
the one streaming: its text, the live figures and the context used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Slot

from app.engine.types import GenerationParams
from app.services import (
    Reply,
    ReplyEnded,
    ReplyFailure,
    ReplyGrowth,
    ReplyReading,
    ReplySaved,
    ReplyWaiting,
)
from app.store import StoreChange
from app.ui.composer import STOPPING_TEXT
from app.ui.pair_loading import LOAD_FIRST
from app.ui.transcript_style import finish_note, reading_note, waiting_note

if TYPE_CHECKING:
    from app.engine.live import LiveStats
    from app.services import ChatController, EngineService, PairInfo, StoreEvents
    from app.store import Settings, Store
    from app.ui.chat_list import ChatList
    from app.ui.composer import Composer
    from app.ui.model_bar import ModelBar
    from app.ui.speculation_panel import SpeculationPanel
    from app.ui.statusbar import StatusBar
    from app.ui.transcript import TranscriptView
    from app.ui.tune_flow import TuneFlow


@dataclass(frozen=True)
class ChatViewHost:
    """What the chat view asks of the window it serves.

    Attributes:
        settings: The window's settings as they are now.
        save_settings: Saves these changes to the settings.
        show_error: Shows one line of trouble in the window.
        hide_error: Hides the line of trouble.
        pair: The loaded pair, or ``None`` while none is loaded.
    """

    settings: Callable[[], Settings]
    save_settings: Callable[..., None]
    show_error: Callable[[str], None]
    hide_error: Callable[[], None]
    pair: Callable[[], PairInfo | None]


class ChatView(QObject):
    """The window's chat on show and the reply streaming into it.

    It owns which conversation is on show, the system prompt a new chat starts
    with, and how much of the target's window the chat fills.
    """

    def __init__(
        self,
        store: Store,
        events: StoreEvents,
        chat: ChatController,
        service: EngineService,
        tune: TuneFlow,
        live: LiveStats,
        chats: ChatList,
        transcript: TranscriptView,
        composer: Composer,
        model_bar: ModelBar,
        panel: SpeculationPanel,
        status: StatusBar,
        host: ChatViewHost,
        parent: QObject,
    ) -> None:
        """Shows ``store``'s chats in ``transcript`` and streams ``chat``'s replies into it.

        Args:
            store: Where the chats live.
            events: The store's changes, which repaint the chat on show.
            chat: The window's reply: started, stopped and painted here.
            service: The engine the window's reply shares with the local server.
            tune: The draft-length calibration, which Stop also ends.
            live: The live figures of the reply in flight.
            chats: The chat list: new chat, selection and search hits.
            transcript: Where the chat on show and the reply are painted.
            composer: The message field with Send and Stop.
            model_bar: The temperature and prompt-lookup choices.
            panel: The speculation panel: the draft length and the live gauge.
            status: The status bar: live figures, the context and passing messages.
            host: What the chat view asks of the window.
            parent: The window, the chat view's owner.
        """
        super().__init__(parent)
        self._store = store
        self._chat = chat
        self._service = service
        self._tune = tune
        self._live = live
        self._chats = chats
        self._transcript = transcript
        self._composer = composer
        self._model_bar = model_bar
        self._panel = panel
        self._status = status
        self._host = host
        self._conversation_id: int | None = None
        self._pending_system_prompt: str | None = None
        self._context_used: int | None = 0  # None while a reply's prompt is not counted
        self._context_idle = 0  # the count before the reply in flight, should it end uncounted
        chats.new_requested.connect(self._on_new_requested)
        chats.conversation_selected.connect(self._on_conversation_selected)
        chats.search_hit_selected.connect(self._on_search_hit_selected)
        events.changed.connect(self._on_store_changed)
        chat.started.connect(self._on_reply_started)
        chat.stopping.connect(self._on_reply_stopping)
        chat.waiting.connect(self._on_reply_waiting)
        chat.reading.connect(self._on_reply_reading)
        chat.grew.connect(self._on_reply_grew)
        chat.saved.connect(self._on_reply_saved)
        chat.ended.connect(self._on_reply_ended)
        chat.failed.connect(self._on_reply_failed)
        composer.send_requested.connect(self._on_send_requested)
        composer.stop_requested.connect(self._on_stop_requested)

    @property
    def conversation_id(self) -> int | None:
        """The conversation on show, or ``None`` before the first message of a new chat."""
        return self._conversation_id

    @property
    def pending_system_prompt(self) -> str | None:
        """The system prompt the next new chat starts with (the last preset's), if any."""
        return self._pending_system_prompt

    @property
    def context_used(self) -> int | None:
        """Tokens of the target's window the chat fills; ``None`` while being counted."""
        return self._context_used

    # Choosing the chat

    @Slot()
    def new_conversation(self) -> None:
        """Shows an empty chat; it is created with its first message (File ▸ New Chat)."""
        self._conversation_id = None
        self._chats.clear_selection()
        self._transcript.show_messages([])
        self._context_used = 0
        self.update_context()
        self._composer.focus()

    def forget_conversation(self) -> None:
        """Shows no chat: the one on show was deleted, another may be picked next."""
        self._conversation_id = None

    def repaint(self) -> None:
        """Paints the chat on show again (new colours), unless a reply streams."""
        if self._conversation_id is not None and not self._chat.busy:
            self._show_conversation(self._conversation_id)

    def use_system_prompt(self, prompt: str | None) -> None:
        """New chats start with ``prompt``; a chat that has messages keeps its own.

        A system prompt put on a chat after its replies would read, in the chat
        and its export, as if they had followed it (File ▸ System Prompt… sets
        one on purpose).

        Args:
            prompt: A preset's system prompt; empty or ``None`` for none.
        """
        self._pending_system_prompt = prompt or None

    @Slot()
    def _on_new_requested(self) -> None:
        self.new_conversation()

    @Slot(int)
    def _on_conversation_selected(self, cid: int) -> None:
        if cid != self._conversation_id:
            self._show_conversation(cid)

    @Slot(int, int)
    def _on_search_hit_selected(self, cid: int, message_id: int) -> None:
        reply = self._chat.reply
        streaming_here = reply is not None and reply.conversation_id == cid
        shown = {m.id for m in self._store.messages(cid)}
        # The hit may be on another branch: that branch comes on screen, unless a
        # reply streams into the branch shown.
        if message_id not in shown and not streaming_here:
            with contextlib.suppress(ValueError):  # deleted since the search ran
                self._store.switch_branch(message_id)
        self._show_conversation(cid)
        self._transcript.highlight_message(message_id)

    @Slot(object)
    def _on_store_changed(self, change: StoreChange) -> None:
        """Repaints the chat on show when what it shows changed (a message, the branch).

        The reply's own saves are left to the reply's signals: it paints itself as
        it streams, and its end is painted once it is saved.
        """
        cid = self._conversation_id
        if change.kind != "messages" or cid is None or cid not in change.conversation_ids:
            return
        reply = self._chat.reply
        if self._chat.saving or (reply is not None and reply.conversation_id == cid):
            return
        self._show_conversation(cid)

    def _show_conversation(self, conversation_id: int, upto: int | None = None) -> None:
        self._conversation_id = conversation_id
        reply = self._chat.reply
        streaming = (
            reply if reply is not None and reply.conversation_id == conversation_id else None
        )
        # The streaming reply, saved so far, is shown below as it streams.
        messages = [
            m
            for m in self._store.messages(conversation_id)
            if reply is None or m.id != reply.message_id
        ]
        if upto is not None:  # a regenerated reply replaces what followed its prompt
            ids = [m.id for m in messages]
            messages = messages[: ids.index(upto) + 1] if upto in ids else messages
        self._transcript.show_messages(messages, self._store.branches(conversation_id))
        last = next((m.stats for m in reversed(messages) if m.stats is not None), None)
        self._context_idle = last.context_tokens if last else 0
        # While a reply streams here, the context is the reply's, not the last one saved.
        self._context_used = self._context_idle if streaming is None else streaming.context_tokens
        self.update_context()
        if streaming is not None:
            self._transcript.begin_reply()
            if streaming.reading is not None:
                self._transcript.show_reading(reading_note(streaming.reading))
            elif streaming.waiting:
                self._transcript.show_reading(waiting_note(streaming.waiting))
            self._transcript.append_segments(streaming.segments)

    def update_context(self) -> None:
        """Shows how much of the loaded target's window the chat on show fills."""
        pair = self._host.pair()
        window = pair.context_length if pair is not None else None
        self._status.show_context(self._context_used, window)

    # Sending and the reply

    def params(self) -> GenerationParams:
        """What the window's replies are asked with: the settings and the bars' choices."""
        shown = {
            "temperature": self._model_bar.temperature(),
            "drafting": self._panel.drafting(),
            "prompt_lookup": self._model_bar.uses_lookup(),
        }
        return GenerationParams(**{**self._host.settings().sampling(), **shown})

    def start_reply(self, cid: int, parent_id: int | None = None) -> None:
        """Asks for the conversation's next reply; it is shown once the reply starts.

        Args:
            cid: The conversation to reply in.
            parent_id: The message to reply to; its last message when ``None``.
        """
        self._chat.start(cid, self.params(), parent_id)

    def stop(self) -> None:
        """Stops the window's reply and calibration; the server's replies run on."""
        self._chat.cancel()
        self._tune.cancel()

    @Slot(str)
    def _on_send_requested(self, text: str) -> None:
        # The server's replies do not hold the window's back: it joins their batch,
        # or waits for a place and says so.
        if self._chat.busy or self._service.calibrating:
            return
        if self._host.pair() is None:
            self._host.show_error(LOAD_FIRST)
            return
        self._host.hide_error()
        if self._conversation_id is None:
            title = " ".join(text.split())[:48]
            conversation = self._store.create_conversation(
                title, system_prompt=self._pending_system_prompt
            )
            self._conversation_id = conversation.id
        cid = self._conversation_id
        self._store.add_message(cid, "user", text)
        self._composer.clear()
        self.start_reply(cid)
        self._host.save_settings(
            drafting=self._panel.drafting(),
            prompt_lookup=self._model_bar.uses_lookup(),
            temperature=self._model_bar.temperature(),
        )

    @Slot()
    def _on_stop_requested(self) -> None:
        self.stop()

    @Slot(object)
    def _on_reply_started(self, reply: Reply) -> None:
        self._chats.select(reply.conversation_id)
        self._show_conversation(reply.conversation_id, upto=reply.upto)  # begins the reply
        self._composer.set_busy(True)
        # Nothing of the last reply stays on show: this one's figures come as it streams.
        self._live.begin_message()

    @Slot(object)
    def _on_reply_stopping(self, _reply: Reply) -> None:
        # The engine stops at its next check; until the end arrives, say Stop was heard.
        self._composer.show_stopping()
        self._status.showMessage(STOPPING_TEXT)

    @Slot(object)
    def _on_reply_waiting(self, waiting: ReplyWaiting) -> None:
        if self._conversation_id == waiting.conversation_id:
            self._transcript.show_reading(waiting_note(waiting.running) if waiting.running else "")

    @Slot(object)
    def _on_reply_reading(self, reading: ReplyReading) -> None:
        if self._conversation_id == reading.conversation_id:
            self._transcript.show_reading(reading_note(reading.reading))

    @Slot(object)
    def _on_reply_grew(self, growth: ReplyGrowth) -> None:
        if self._conversation_id == growth.conversation_id:
            self._transcript.append_segments(growth.segments)
            self._context_used = growth.context_tokens
            self.update_context()
        # Batches arrive at most about 30 times a second: one repaint each.
        self._live.add(growth.rounds, growth.baseline_tps)
        auto_k = next((r.k for r in reversed(growth.rounds) if r.auto and r.k), None)
        if auto_k is not None:
            self._panel.show_auto_k(auto_k)

    @Slot(object)
    def _on_reply_saved(self, saved: ReplySaved) -> None:
        cid = saved.conversation_id
        if cid != self._conversation_id:
            return
        self._chats.select(cid)
        if saved.branched:
            self._show_conversation(cid)  # shows the new branch's switcher
            return
        message_id = saved.message.id if saved.message is not None else None
        stats_id = message_id if saved.stats is not None else None
        note = finish_note(saved.finish_reason, saved.stats)
        self._transcript.end_reply(note, stats_id, message_id=message_id)

    @Slot(object)
    def _on_reply_ended(self, ended: ReplyEnded) -> None:
        self._composer.set_busy(False)
        if self._status.currentMessage() == STOPPING_TEXT:
            self._status.clearMessage()
        if ended.stats is not None:
            # The final figures replace the live ones, in the panel as in the status bar.
            self._live.finish_message(ended.stats)
            self._status.show_reply_stats(ended.stats)
        used = ended.context_tokens
        self._context_used = self._context_idle if used is None else used
        self.update_context()

    @Slot(object)
    def _on_reply_failed(self, failure: ReplyFailure) -> None:
        self._host.show_error(failure.message)
