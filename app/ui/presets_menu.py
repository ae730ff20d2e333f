"""Presets: the top bar's list, applying one, saving the settings as one, deleting one."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal, Slot

from app.engine.types import SAMPLING_FIELDS, DraftSetting, Sampling
from app.errors import first_line
from app.store import Settings
from app.store import presets as p
from app.store.presets import Preset, PresetsFile
from app.ui.model_bar import ModelBar
from app.ui.speculation_panel import SpeculationPanel


class PresetsMenu(QObject):
    """Keeps the model bar's preset list in step with the presets file.

    The list names a preset only while the settings are that preset's: once
    one of them differs, it reads "Custom" again.

    Signals:
        applied: The :class:`Preset` whose temperature, lookup and draft
            settings now show; the rest (sampling, system prompt) is the
            window's to keep.
        failed: One line saying why a preset could not be saved or deleted.
    """

    applied = Signal(object)
    failed = Signal(str)

    def __init__(
        self,
        presets_file: PresetsFile,
        model_bar: ModelBar,
        panel: SpeculationPanel,
        settings: Callable[[], Settings],
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._file = presets_file
        self._model_bar = model_bar
        self._panel = panel
        self._settings = settings
        self._applying = False
        self.presets: list[Preset] = presets_file.load()
        self._fill()
        model_bar.preset_activated.connect(self._on_preset_activated)
        model_bar.temp_spin.valueChanged.connect(self._on_value_changed)
        model_bar.lookup_check.toggled.connect(self._on_toggled)
        panel.drafting_changed.connect(self._on_drafting_changed)

    def _fill(self) -> None:
        self._model_bar.set_presets([preset.name for preset in self.presets])

    def apply(self, preset: Preset) -> None:
        """Shows a preset's temperature, lookup and draft settings, then says so."""
        self._applying = True
        try:
            self._model_bar.set_temperature(preset.temperature)
            self._model_bar.set_lookup(preset.prompt_lookup)
            self._panel.set_drafting(preset.drafting)
            self.applied.emit(preset)
        finally:
            self._applying = False

    def matches(self, preset: Preset) -> bool:
        """Whether what shows and the settings are ``preset``'s (what applying it sets)."""
        s = self._settings()
        shown = (
            self._model_bar.temperature() == preset.temperature
            and self._model_bar.uses_lookup() == preset.prompt_lookup
            and self._panel.drafting().num_draft == preset.drafting.num_draft
        )
        return shown and all(
            getattr(s, f) == getattr(preset, f)
            for f in applied_fields(preset)
            if f != "temperature"
        )

    def follow_settings(self) -> None:
        """Shows "Custom" once the settings left the chosen preset's."""
        index = self._model_bar.preset_index()
        if self._applying or not 1 <= index <= len(self.presets):
            return
        if not self.matches(self.presets[index - 1]):
            self._model_bar.show_custom()

    @Slot(float)
    def _on_value_changed(self, _value: float) -> None:
        self.follow_settings()

    @Slot(bool)
    def _on_toggled(self, _on: bool) -> None:
        self.follow_settings()

    @Slot(object)
    def _on_drafting_changed(self, _setting: DraftSetting) -> None:
        self.follow_settings()

    def save_current(self, name: str, sampling: Sampling, system_prompt: str) -> Preset | None:
        """Saves ``sampling``: what the window's replies are asked with now."""
        return self.save(Preset(name, system_prompt, **sampling.sampling()))

    def save(self, preset: Preset) -> Preset | None:
        """Saves ``preset`` (replacing one of its name) and chooses it in the list."""
        try:
            preset = preset.validated()
            presets = p.upsert(self.presets, preset)
            self._file.save(presets)
        except (ValueError, OSError) as exc:
            self.failed.emit(f"Could not save the preset: {first_line(exc)}")
            return None
        self.presets = presets
        self._fill()
        self._model_bar.show_preset(preset.name)
        return preset

    @Slot()
    def delete_chosen(self) -> None:
        """Deletes the preset chosen in the list (built-in presets cannot go)."""
        index = self._model_bar.preset_index()
        if not 1 <= index <= len(self.presets):
            return
        try:
            presets = p.remove(self.presets, self.presets[index - 1].name)
            self._file.save(presets)
        except (ValueError, OSError) as exc:
            self.failed.emit(f"Could not delete the preset: {first_line(exc)}")
            return
        self.presets = presets
        self._fill()

    @Slot(int)
    def _on_preset_activated(self, index: int) -> None:
        if 1 <= index <= len(self.presets):
            self.apply(self.presets[index - 1])


def applied_fields(preset: Preset) -> tuple[str, ...]:
    """The sampling fields applying ``preset`` sets.

    A built-in preset is a style (temperature, nucleus, penalty): it leaves the
    reply length and the seed as the user set them. One the user saved sets
    everything it saved.
    """
    if p.is_builtin(preset.name):
        return tuple(f for f in SAMPLING_FIELDS if f not in ("max_tokens", "seed"))
    return SAMPLING_FIELDS
