"""The local server's panel: its URL, its API key (masked) and the last requests it served.

Rows carry only what :class:`RequestLog` says about a request's shape (method, path,
status, tokens, time taken); a debug-logged prompt is never kept or shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QPersistentModelIndex,
    Qt,
    Signal,
    Slot,
)
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.server.http import RequestLog
from app.services import EngineLoad

MAX_ROWS = 20
NO_KEY_TEXT = "none (loopback only)"
NOT_RUNNING_TEXT = "not running"
START_TEXT, STOP_TEXT = "Start Server", "Stop Server"
COLUMNS = ("Time", "Method", "Path", "Status", "Tokens", "Duration")
PATH_COLUMN = COLUMNS.index("Path")

_Index = QModelIndex | QPersistentModelIndex


def load_text(load: EngineLoad) -> str:
    """What the engine does now, and what its shared batch has done, in a line or two."""
    if not load.active and not load.waiting:
        now = "idle"
    else:
        parts = []
        if load.active:
            parts.append(f"{load.active} repl{'y' if load.active == 1 else 'ies'} running")
            if load.batched > 1:
                parts[-1] += f", {load.batched} in one batch (up to {load.max_batch})"
        if load.waiting:
            parts.append(f"{load.waiting} waiting")
        now = "; ".join(parts)
    batch = load.batch
    if not batch.rounds:
        return now
    done = f"Shared batch so far: {batch.rounds:,} rounds, up to {batch.largest} replies a round"
    if batch.acceptance is not None:
        done += f", {batch.acceptance:.0%} of drafts accepted"
    if batch.shared:
        done += f", {batch.shared:,} prompt tokens shared rather than read"
    return f"{now}\n{done}"


def mask_key(key: str) -> str:
    """Dots for ``key``, with its last four characters when it is long enough to spare them."""
    return "•" * 8 + (key[-4:] if len(key) >= 12 else "")


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One served request as the panel shows it."""

    at: datetime
    method: str
    path: str
    status: int
    tokens: int
    seconds: float

    @classmethod
    def from_log(cls, entry: RequestLog, at: datetime) -> RequestRow:
        # Copies field by field so that the prompt of a debug log stays behind.
        return cls(at, entry.method, entry.path, entry.status, entry.tokens, entry.seconds)

    def cells(self) -> tuple[str, ...]:
        return (
            self.at.strftime("%H:%M:%S"),
            self.method,
            self.path,
            str(self.status),
            f"{self.tokens:,}" if self.tokens else "",
            f"{self.seconds * 1000:,.0f} ms",
        )


class RequestListModel(QAbstractTableModel):
    """The newest :data:`MAX_ROWS` requests, newest first, over a plain list."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rows: list[RequestRow] = []

    def add(self, row: RequestRow) -> None:
        self.beginInsertRows(QModelIndex(), 0, 0)
        self.rows.insert(0, row)
        self.endInsertRows()
        if len(self.rows) > MAX_ROWS:
            self.beginRemoveRows(QModelIndex(), MAX_ROWS, len(self.rows) - 1)
            del self.rows[MAX_ROWS:]
            self.endRemoveRows()

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(COLUMNS)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        # A cell too narrow for its text is elided: the tooltip has it whole.
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
            return self.rows[index.row()].cells()[index.column()]
        return None

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None


class ServerPanel(QDialog):
    """Modeless: it stays open and its list grows while the server answers.

    Signals:
        switch_requested: Start Server (``True``) or Stop Server (``False``) was pressed.
    """

    switch_requested = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Local Server")
        self.setAccessibleName("Local server")
        self._key: str | None = None
        self._running = False
        self.url_label = QLabel(NOT_RUNNING_TEXT)
        self.url_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.switch_button = QPushButton(START_TEXT)
        self.switch_button.setAccessibleName("Start or stop the local server")
        self.switch_button.clicked.connect(self._on_switch_clicked)
        self.problem_label = QLabel()
        self.problem_label.setWordWrap(True)
        self.problem_label.hide()
        url_row = QHBoxLayout()
        url_row.addWidget(self.url_label, 1)
        url_row.addWidget(self.switch_button)
        self.key_label = QLabel(NO_KEY_TEXT)
        self.copy_button = QPushButton("Copy Key")
        self.copy_button.setEnabled(False)
        self.copy_button.clicked.connect(self.copy_key)
        key_row = QHBoxLayout()
        key_row.addWidget(self.key_label, 1)
        key_row.addWidget(self.copy_button)
        self.load_label = QLabel(load_text(EngineLoad()))
        self.load_label.setAccessibleName("What the engine is doing")
        self.load_label.setWordWrap(True)
        form = QFormLayout()
        form.addRow("URL:", url_row)
        form.addRow("API key:", key_row)
        form.addRow("Engine:", self.load_label)

        self.model = RequestListModel(self)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setAccessibleName("Recent requests")
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.verticalHeader().hide()
        # One line a request; a path too long for its column loses its middle, not its end.
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(PATH_COLUMN, QHeaderView.ResizeMode.Stretch)
        self.model.rowsInserted.connect(self._on_rows_inserted)

        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.problem_label)
        layout.addWidget(QLabel(f"Last {MAX_ROWS} requests (no message text):"))
        layout.addWidget(self.table, 1)
        self.resize(560, 360)

    def set_server(self, url: str, key: str | None) -> None:
        """Shows the server's base URL (empty: stopped), the key it checks and the switch."""
        self._running = bool(url)
        self.url_label.setText(url or NOT_RUNNING_TEXT)
        self.switch_button.setText(STOP_TEXT if url else START_TEXT)
        if url:
            self.problem_label.hide()
        self._key = key or None
        self.key_label.setText(mask_key(key) if key else NO_KEY_TEXT)
        self.copy_button.setEnabled(self._key is not None)

    def add_request(self, entry: RequestLog, at: datetime | None = None) -> None:
        """Adds one served request at the top; ``at`` defaults to now."""
        self.model.add(RequestRow.from_log(entry, at or datetime.now()))

    @Slot(object)
    def show_load(self, load: EngineLoad) -> None:
        """Shows what the engine runs now (the window's reply too) and its batch's totals."""
        self.load_label.setText(load_text(load))

    def show_problem(self, message: str) -> None:
        """Says why the server did not start, under its URL."""
        self.problem_label.setText(message)
        self.problem_label.show()

    @Slot()
    def _on_rows_inserted(self) -> None:
        # Qt sizes ResizeToContents columns to the rows it had when shown, not to later
        # ones: without this a time or a duration is cut ("2…7") in a panel left open.
        self.table.horizontalHeader().resizeSections()

    @Slot()
    def _on_switch_clicked(self) -> None:
        self.switch_requested.emit(not self._running)

    def copy_key(self) -> None:
        if self._key is not None:
            QGuiApplication.clipboard().setText(self._key)
