"""Parameter tables more than one test module runs."""

from __future__ import annotations

# (the cutoff setting, temperature, num_draft, whether drafts end early)
CUTOFF_CASES = [
    (None, 0.7, None, True),  # the default: Auto's sampled replies, where it measured faster
    (None, 0.0, None, False),  # greedy: within noise, so not
    (None, 0.7, 4, False),  # a fixed k drafts the k it was given
    (False, 0.7, None, False),
    (True, 0.0, 4, True),
]
