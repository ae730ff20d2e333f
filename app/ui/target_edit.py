"""A field for a load target: a model shown by its name, or a remote engine by its URL."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QLineEdit, QWidget

from app.engine.loader import MTP
from app.hub.library import hub_repo_id
from app.remote import is_remote_target, target_text, target_tooltip
from app.ui.fit import fit_placeholder

BUILT_IN = "Built-in (MTP)"  # the draft that is the target's own MTP head


def model_name(target: str) -> str:
    """A load target as a user knows it: a Hub cache folder as its repo id
    (``org/name``), another folder as its name, a remote engine as its URL, the
    target's own MTP head as :data:`BUILT_IN`."""
    target = target.strip()
    if target == MTP:
        return BUILT_IN
    if not target or is_remote_target(target):
        return target_text(target)
    folder = Path(target)
    return hub_repo_id(folder) or folder.name or target


class TargetEdit(QLineEdit):
    """Shows a load target as the user knows it; :meth:`target` gives the target itself.

    A model folder shows as the model's name, its path in the tooltip; a remote
    engine's target carries its kind and models in an encoding of Tandem's own,
    and the field shows only its URL. Either keeps the target behind the text
    for as long as the text stays as it is; what the user types is the target.
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
        self.setText(model_name(self._target))
        self.setToolTip(target_tooltip(self._target))
        self.setCursorPosition(0)  # a long folder shows its start

    def target(self) -> str:
        """The target shown: the one set, or what the user typed in its place, trimmed."""
        text = self.text().strip()
        if self._target and text == model_name(self._target):
            return self._target
        return text
