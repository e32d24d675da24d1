"""The dashboard's pages and files: HTML routes, /static, and Plotly.

The frontend ships inside the wheel (gradwatch_server/frontend, see pyproject.toml); running
from a source checkout, the repository's frontend/ folder is used instead. Plotly is the basic
bundle that `make setup` puts in frontend/vendor/ (vendor/package.json): the dashboard draws
scatter traces only, and the smaller bundle starts sooner (docs/design.md, The dashboard). A
frontend without it (a server installed from a checkout where npm was not run) gets the full
bundle of the plotly package, so the dashboard still works offline.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles


def find_frontend(override: Path | None = None) -> Path:
    """The dashboard folder: `override`, else the packaged copy, else the source checkout's."""
    if override is not None:
        return override
    packaged = resources.files("gradwatch_server") / "frontend"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "frontend"


def plotly_js(folder: Path) -> Path:
    """The dashboard's own Plotly bundle in `folder`, else the plotly package's full one (offline either way)."""
    own = folder / "vendor" / "plotly.min.js"
    if own.is_file():
        return own
    return Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))


def _page(folder: Path, name: str) -> Response:
    path = folder / name
    if not path.is_file():
        return HTMLResponse(
            f"<h1>gradwatch</h1><p>The dashboard page {name} is missing from {folder}. "
            "Reinstall gradwatch-server (pip install ./backend) or set GRADWATCH_FRONTEND_DIR.</p>",
            status_code=404,
        )
    return FileResponse(path, media_type="text/html")


def mount_dashboard(app: FastAPI, folder: Path) -> None:
    """Add the HTML routes and the static files of the dashboard in `folder`."""
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    def index() -> Response:
        return _page(folder, "index.html")

    @router.get("/runs/{run_id}")
    def run_page() -> Response:
        return _page(folder, "run.html")

    @router.get("/compare")
    def compare_page() -> Response:
        return _page(folder, "compare.html")

    # Before the /static mount, which would answer this path only when `folder` has the file.
    @router.get("/static/vendor/plotly.min.js")
    def plotly() -> FileResponse:
        return FileResponse(plotly_js(folder), media_type="text/javascript")

    app.include_router(router)
    app.mount("/static", StaticFiles(directory=folder, check_dir=False), name="static")
