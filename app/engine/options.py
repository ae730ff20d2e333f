"""How the engine runs: one frozen value, chosen where a decoder is made.

Every switch that changes how decoding runs, never what it gives, lives here:
the app runs the defaults and ``tandem bench`` compares the others.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast, get_args

from app.engine import attention, wide

PROBE_EVERY = 64  # a plain target step this often keeps the baseline current


@dataclass(frozen=True)
class EngineOptions:
    """How a decoder runs.

    Attributes:
        attention: Verification attention (:mod:`app.engine.attention`):
            mlx-lm's (``sdpa``), over a bucketed key length, or ``auto``.
        wide: Rows from which 4-bit projections run on weights dequantized on
            the fly (:mod:`app.engine.wide`): ``auto``, ``off`` or a count.
        probe_every: A lone reply's drafting rounds between two plain probes
            of the baseline; 0 never probes.
        draft_cutoff: End a draft early where the draft is unsure: True
            always, False never, None where it measured faster.
        stretch: Auto plans each round from where it starts along a stretch
            of accepted drafts (off: every round alike).
        side_by_side: The batch verifies several requests over target caches
            kept side by side from round to round, rather than each apart.
        share_prompts: Joining requests copy the prompt rows other open
            requests hold of them, rather than each reading its own.
    """

    attention: attention.Mode = "auto"
    wide: wide.Mode = "auto"
    probe_every: int = PROBE_EVERY
    draft_cutoff: bool | None = None
    stretch: bool = True
    side_by_side: bool = True
    share_prompts: bool = True

    def __post_init__(self) -> None:
        if self.attention not in get_args(attention.Mode):
            raise ValueError(f"attention must be one of {get_args(attention.Mode)}")
        wide.check_mode(self.wide)
        if self.probe_every < 0:
            raise ValueError("probe_every must be 0 or more")

    def apply(self) -> None:
        """Sets the paths mlx-lm's models call into, for the whole process, to these options'.

        What ``tandem bench`` does so that mlx-lm's loop runs the paths its
        decoders do; a decoder itself runs them only inside :meth:`applied`.
        """
        attention.set_mode(self.attention)
        wide.set_mode(self.wide)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """These options' paths for what runs inside; the process's own again after.

        A decoder's forwards all run inside, so one decoder's paths never reach
        another decoder's or code beside it that calls the same models.
        """
        before = attention.mode(), wide.mode()
        self.apply()
        try:
            yield
        finally:
            attention.set_mode(cast(attention.Mode, before[0]))
            wide.set_mode(before[1])


DEFAULT_OPTIONS = EngineOptions()
