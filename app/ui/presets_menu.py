"""Presets: the top bar's list, applying one, saving the settings as one, deleting one."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal, Slot

from app.errors import first_line
from app.store import Settings
from app.store import presets as p
from app.store.presets import Preset, PresetsFile
from app.ui.model_bar import ModelBar
from app.ui.speculation_panel import SpeculationPanel


class PresetsMenu(QObject):
    """Keeps the model bar's preset list in step with the presets file.

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
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._file = presets_file
        self._model_bar = model_bar
        self._panel = panel
        self.presets: list[Preset] = presets_file.load()
        self._fill()
        model_bar.preset_activated.connect(self._on_preset_activated)

    def _fill(self) -> None:
        self._model_bar.set_presets([preset.name for preset in self.presets])

    def apply(self, preset: Preset) -> None:
        """Shows a preset's temperature, lookup and draft settings, then says so."""
        self._model_bar.set_temperature(preset.temperature)
        self._model_bar.set_lookup(preset.prompt_lookup)
        self._panel.set_draft(preset.num_draft, preset.auto_draft)
        self.applied.emit(preset)

    def save_current(self, name: str, settings: Settings, system_prompt: str) -> Preset | None:
        """Saves what shows now (temperature, lookup, draft) and ``settings``' sampling."""
        return self.save(
            Preset(
                name=name,
                system_prompt=system_prompt,
                temperature=self._model_bar.temperature(),
                top_p=settings.top_p,
                top_k=settings.top_k,
                min_p=settings.min_p,
                repetition_penalty=settings.repetition_penalty,
                max_tokens=settings.max_tokens,
                seed=settings.seed,
                num_draft=self._panel.fixed_k(),
                auto_draft=self._panel.auto_draft(),
                prompt_lookup=self._model_bar.uses_lookup(),
            )
        )

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
