"""In Jupyter: a watcher displays as a link to its run page, and `w.show()` embeds the live page
(a real `IPython.display.IFrame`); without IPython, a clear error."""

from __future__ import annotations

import html
import re
import sys
from collections.abc import Iterator

import pytest
import torch

import gradwatch

pytestmark = pytest.mark.unit

SERVER = "http://127.0.0.1:9"


@pytest.fixture
def watcher() -> Iterator[gradwatch.Watcher]:
    model = torch.nn.Linear(2, 1)
    w = gradwatch.watch(
        torch.optim.SGD(model.parameters(), lr=0.1),
        model=model,
        server=SERVER,
        run='lr <1e-3> & "quotes"',
        project="nb",
        warn=False,
    )
    yield w
    w.close(timeout=0.1)


def test_repr_html_links_to_the_run_page(watcher: gradwatch.Watcher) -> None:
    page = f"{SERVER}/runs/{watcher.run_id}"
    assert watcher.url == page
    shown = watcher._repr_html_()
    assert re.search(rf'<a href="{re.escape(page)}" target="_blank"', shown), shown
    assert html.escape('lr <1e-3> & "quotes"') in shown and "<1e-3>" not in shown  # the name is escaped
    assert "nb" in shown and watcher.run_id in shown


def test_show_embeds_the_live_page(watcher: gradwatch.Watcher) -> None:
    from IPython.display import IFrame

    frame = watcher.show(height=420)
    assert isinstance(frame, IFrame)
    assert frame.src == f"{SERVER}/runs/{watcher.run_id}" and frame.height == 420 and frame.width == "100%"
    assert f'src="{SERVER}/runs/{watcher.run_id}"' in frame._repr_html_()


@pytest.mark.parametrize("height", [0, 99, 10_001, 3.5, "600", True])
def test_show_refuses_a_height_that_is_not_pixels(watcher: gradwatch.Watcher, height: object) -> None:
    with pytest.raises(ValueError, match="height must be a whole number of pixels"):
        watcher.show(height=height)  # type: ignore[arg-type]


def test_show_without_ipython_says_what_to_do(watcher: gradwatch.Watcher, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "IPython", None)  # what `import IPython` meets where it is not installed
    monkeypatch.setitem(sys.modules, "IPython.display", None)
    with pytest.raises(
        ImportError,
        match=rf"needs IPython \(pip install ipython\); outside a notebook open "
        rf"{re.escape(watcher.url)}",
    ):
        watcher.show()
