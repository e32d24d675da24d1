"""gradwatch: see, live, what your PyTorch optimizer sees.

    import gradwatch
    w = gradwatch.watch(optimizer, model=model, run="lr3e-4", project="gpt-small")
"""
__version__ = "0.1.0"

from .watcher import Watcher, watch  # noqa: E402  (watcher reads __version__)

__all__ = ["Watcher", "watch", "__version__"]
