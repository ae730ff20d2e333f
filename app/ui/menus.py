"""The menu bar: File, Edit, View, Window and Help, and what Help and Window do."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QApplication, QMainWindow, QMenu, QMessageBox, QWidget

from app.ui.shortcuts import Key, settings_shortcut, shortcut_text

if TYPE_CHECKING:
    from app.ui.main_window import MainWindow

# What Help lists, in the platform's notation (⌘N on a Mac, Ctrl+N elsewhere).
HELP_KEYS: tuple[tuple[Key, str], ...] = (
    ("Ctrl+N", "New chat"),
    ("Ctrl+Return", "Send"),
    ("Esc", "Stop the reply"),
    ("Ctrl+Shift+M", "Models"),
    ("Ctrl+Alt+S", "Show or hide the speculation panel"),
)


def help_text() -> str:
    """Help's text, its shortcuts written as this platform writes them."""
    keys: list[tuple[Key, str]] = [*HELP_KEYS, (settings_shortcut(), "Settings")]
    rows = "\n".join(f"<tr><td>{shortcut_text(k)}</td><td>{what}</td></tr>" for k, what in keys)
    return f"""<b>Tandem Help</b>
<p>Load a <i>target</i> model and a smaller <i>draft</i> of the same family (Models…,
{shortcut_text("Ctrl+Shift+M")}). The draft proposes tokens, the target checks them all in
one pass: the reply is exactly the target's, only faster.</p>
<table>
{rows}
</table>
<p>The speculation panel shows how many drafted tokens the target accepts. With Auto on,
each round drafts as many tokens as pay best on this machine; untick it to fix k with the
slider. Tune… measures what verification costs and the speed of each k.</p>"""


Shortcut = QKeySequence | QKeySequence.StandardKey | str | None


@dataclass(frozen=True)
class Menus:
    """The menus and actions other parts of the window reach."""

    file_menu: QMenu
    edit_menu: QMenu
    chat_actions: tuple[QAction, ...]  # also the chat list's context menu
    panel_action: QAction
    server_panel_action: QAction


def _action(
    owner: QWidget,
    menu: QMenu,
    text: str,
    slot: Callable[..., object],
    shortcut: Shortcut = None,
    role: QAction.MenuRole | None = None,
) -> QAction:
    action = QAction(text, owner)
    if shortcut is not None:
        action.setShortcut(QKeySequence(shortcut))
    if role is not None:
        action.setMenuRole(role)  # macOS moves it into the Tandem menu
    action.triggered.connect(slot)
    menu.addAction(action)
    return action


def _edit(method: str) -> None:
    # The focused text field does the work, as in any Mac app.
    widget = QApplication.focusWidget()
    if widget is not None and hasattr(widget, method):
        getattr(widget, method)()


def show_help(parent: QWidget) -> None:
    QMessageBox.information(parent, "Tandem Help", help_text())


def show_about(parent: QWidget) -> None:
    from app import __version__

    QMessageBox.about(
        parent,
        "About Tandem",
        f"<b>Tandem</b> {__version__}<br>Private, local chat on your Mac. A small draft "
        "model proposes tokens, the large target model checks them, and you get the "
        "target's exact reply, faster.",
    )


def toggle_zoom(window: QMainWindow) -> None:
    window.showNormal() if window.isMaximized() else window.showMaximized()


def build_menus(w: MainWindow, panel_shown: bool) -> Menus:
    """Fills ``w``'s menu bar; ``panel_shown`` ticks View ▸ Speculation Panel."""
    keys = QKeySequence.StandardKey
    bar = w.menuBar()

    file_menu = bar.addMenu("&File")
    _action(w, file_menu, "&New Chat", w.chat_view.new_conversation, keys.New)
    acts = w.chat_actions  # the chat actions the window composed
    chat_actions = (
        _action(w, file_menu, "&Rename Chat…", acts._on_rename_conversation_requested),
        _action(
            w, file_menu, "D&uplicate Chat", acts._on_duplicate_conversation_requested, "Ctrl+D"
        ),
        _action(w, file_menu, "S&ystem Prompt…", acts._on_system_prompt_requested),
        _action(w, file_menu, "&Export Chat…", acts._on_export_conversation_requested, "Ctrl+E"),
        _action(
            w, file_menu, "&Delete Chat…", acts._on_delete_conversation_requested, "Ctrl+Backspace"
        ),
    )
    file_menu.addSeparator()
    _action(w, file_menu, "Export &All Chats…", acts._on_export_all_requested)
    _action(w, file_menu, "&Import Chats…", acts._on_import_requested)
    file_menu.addSeparator()
    _action(w, file_menu, "&Models…", w.open_model_manager, "Ctrl+Shift+M")
    file_menu.addSeparator()
    _action(w, file_menu, "&Close Window", w.close, keys.Close)
    prefs = QAction.MenuRole.PreferencesRole
    _action(w, file_menu, "Settings…", w.open_settings, settings_shortcut(), prefs)
    quit_role = QAction.MenuRole.QuitRole
    _action(w, file_menu, "&Quit Tandem", w.close, keys.Quit, quit_role)

    edit = bar.addMenu("&Edit")
    for text, key, method in (
        ("&Undo", keys.Undo, "undo"),
        ("&Redo", keys.Redo, "redo"),
        (None, None, None),
        ("Cu&t", keys.Cut, "cut"),
        ("&Copy", keys.Copy, "copy"),
        ("&Paste", keys.Paste, "paste"),
        ("Select &All", keys.SelectAll, "selectAll"),
    ):
        if text is None:
            edit.addSeparator()
            continue
        _action(w, edit, text, lambda _=False, m=method: _edit(m), key)
    edit.addSeparator()
    _action(w, edit, "&Find in Chats", w.chats.focus_search, keys.Find)

    view = bar.addMenu("&View")
    panel_action = QAction("&Speculation Panel", w)
    panel_action.setCheckable(True)
    panel_action.setChecked(panel_shown)
    panel_action.setShortcut(QKeySequence("Ctrl+Alt+S"))
    panel_action.toggled.connect(w._on_panel_toggled)
    view.addAction(panel_action)
    _action(w, view, "&Tune Draft Length…", w.open_tune_dialog)
    server_panel_action = _action(w, view, "&Local Server…", w.open_server_panel)
    view.addSeparator()
    _action(w, view, "Save Settings as &Preset…", w._on_save_preset_requested)
    _action(w, view, "&Delete Preset", w.presets_menu.delete_chosen)

    window = bar.addMenu("&Window")
    _action(w, window, "&Minimize", w.showMinimized, "Ctrl+M")
    if sys.platform == "darwin":  # Zoom is a Mac convention; elsewhere the title bar maximizes
        _action(w, window, "&Zoom", lambda: toggle_zoom(w))

    help_menu = bar.addMenu("&Help")
    _action(w, help_menu, "Tandem &Help", lambda: show_help(w), keys.HelpContents)
    about = QAction.MenuRole.AboutRole
    _action(w, help_menu, "&About Tandem", lambda: show_about(w), role=about)
    return Menus(file_menu, edit, chat_actions, panel_action, server_panel_action)
