"""A field for a load target: a model folder, or a remote engine shown by its URL."""

from __future__ import annotations

from PySide6.QtWidgets import QLineEdit, QWidget

from app.remote import target_text, target_tooltip
from app.ui.fit import fit_placeholder


class TargetEdit(QLineEdit):
    """Shows a load target as the user knows it; :meth:`target` gives the target itself.

    A remote engine's target carries its kind and models in an encoding of
    Tandem's own; the field shows only its URL and keeps the rest behind it
    for as long as that URL stays as it is.
    """

    def __init__(self, placeholder: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._target = ""
        self.setPlaceholderText(placeholder)
        self.setAccessibleName(placeholder)
        self.setClearButtonEnabled(True)
        fit_placeholder(self)

    def set_target(self, target: str | None) -> None:
        """Shows ``target`` (``None`` or ``""``: none) as text the user can read."""
        self._target = (target or "").strip()
        self.setText(target_text(self._target))
        self.setToolTip(target_tooltip(self._target))
        self.setCursorPosition(0)  # a long folder shows its start

    def target(self) -> str:
        """The target shown: the one set, or what the user typed in its place, trimmed."""
        text = self.text().strip()
        if self._target and text == target_text(self._target):
            return self._target
        return text
