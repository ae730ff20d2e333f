"""The store's change events as a Qt signal."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.store import Store, StoreChange


class StoreEvents(QObject):
    """Emits ``changed`` with a :class:`StoreChange` after each write the store commits.

    The store stays free of Qt; this wrapper is what views subscribe to.
    """

    changed = Signal(object)  # StoreChange

    def __init__(self, store: Store, parent: QObject | None = None) -> None:
        super().__init__(parent)
        unsubscribe = store.subscribe(self._emit)
        # A plain function: it still runs once this object is gone.
        self.destroyed.connect(lambda *_: unsubscribe())

    def _emit(self, change: StoreChange) -> None:
        self.changed.emit(change)
