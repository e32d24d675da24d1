"""gradwatch-run puts this folder first on PYTHONPATH: every Python process the watched command
starts runs this at startup (gradwatch/autowatch.py), then the `sitecustomize` it hides, if any.

It leaves `sys.path` as it would have been: this folder is taken off it again.
"""

import os
import sys


def _gradwatch_start() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        from gradwatch import autowatch

        autowatch.start_from_env()
    except ImportError as exc:
        print(f"gradwatch-run: {sys.executable} cannot import gradwatch ({exc}): not watched", file=sys.stderr)
    except Exception as exc:  # a broken setting must not stop the script
        print(f"gradwatch-run: not watched: {exc}", file=sys.stderr)
    # the sitecustomize this one hides (Debian's, a virtualenv's), now that this folder is off sys.path
    me = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # type: ignore[import-not-found]  # noqa: F401
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        if me is not None:
            sys.modules["sitecustomize"] = me


_gradwatch_start()
