"""The sampling setting the corpus test asks a script for (not a script: test_corpus.py skips `_*.py`)."""

from __future__ import annotations

import os


def every() -> int | str:
    """`watch(every=...)` as the corpus test runs this script: 1 by default, `CORPUS_EVERY=auto`."""
    value = os.environ.get("CORPUS_EVERY", "1")
    return value if value == "auto" else int(value)
