"""``tandem bench``, off the inference path: :mod:`app.bench.bench` times plain
decoding, mlx-lm's speculative loop and Tandem's side by side.

Nothing that serves a chat imports this package (an import-linter contract
says so). No Qt.
"""
