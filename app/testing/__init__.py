"""Models for tests, the self-test and benchmarks, off the inference path.

:mod:`app.testing.tiny` builds tiny random-weight models in the Hugging Face
layout; :mod:`app.testing.synthetic` builds pairs of real shapes with a set
greedy acceptance. Nothing that serves a chat imports this package (an
import-linter contract says so). No Qt.
"""
