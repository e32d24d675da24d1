"""gradwatch: see, live, what your PyTorch optimizer sees.

import gradwatch
w = gradwatch.watch(optimizer, model=model, run="lr3e-4", project="gpt-small")
df = gradwatch.load(w.run_id)  # a notebook: the run as a pandas DataFrame (gradwatch[pandas])
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["GradwatchWarning", "Watcher", "load", "runs", "watch", "__version__"]


def __getattr__(name: str) -> Any:
    """Import torch only when the hook is used: `python -m gradwatch sync` needs none."""
    if name in ("Watcher", "watch"):
        from . import watcher

        return getattr(watcher, name)
    if name in ("load", "runs"):  # pandas is imported when they are called
        from . import dataframes

        return getattr(dataframes, name)
    if name == "GradwatchWarning":  # e.g. warnings.filterwarnings("error", category=gradwatch.GradwatchWarning)
        from .findings import GradwatchWarning

        return GradwatchWarning
    raise AttributeError(f"module 'gradwatch' has no attribute {name!r}")
