"""`gradwatch.options`: the watch options checked once, the server URL resolved and normalised in
one place (the errors of `watch()` itself: test_watch.py; of the callbacks: integrations/)."""

from __future__ import annotations

import dataclasses

import pytest

from gradwatch.options import WatchOptions, check_every, check_name, http_url, server_url

pytestmark = pytest.mark.unit


def test_options_are_checked_when_made_and_stay_as_made() -> None:
    options = WatchOptions(run="r", every="auto")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.run = "other"  # type: ignore[misc]
    with pytest.raises(ValueError, match="run must be 1 to 200 printable characters"):
        dataclasses.replace(options, run="x" * 201)  # a changed copy is checked again
    with pytest.raises(TypeError, match="on_finding must be a function"):
        WatchOptions(on_finding="print")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="flight_recorder must be True, False or None"):
        WatchOptions(flight_recorder=1)  # type: ignore[arg-type]


def test_the_launchers_flags_are_named_in_its_errors() -> None:
    with pytest.raises(ValueError, match=r"^--every must be a whole number >= 1 .*; got 0$"):
        check_every(0, "--every")
    with pytest.raises(ValueError, match=r"^--run must be 1 to 200 printable characters"):
        check_name("--run", "a\nb")


def test_the_server_is_the_argument_then_the_environment_then_the_default() -> None:
    assert server_url("http://a:1", {"GRADWATCH_SERVER": "http://b:2"}) == "http://a:1"
    assert server_url(None, {"GRADWATCH_SERVER": "http://b:2"}) == "http://b:2"
    assert server_url(None, {}) == "http://127.0.0.1:8765"


@pytest.mark.parametrize(
    "server, path, url",
    [
        ("http://127.0.0.1:8765", "", "http://127.0.0.1:8765"),
        (" wss://host/gw/ ", "/runs/abc", "https://host/gw/runs/abc"),
        ("ws://localhost:1", "/api", "http://localhost:1/api"),
    ],
)
def test_http_url(server: str, path: str, url: str) -> None:
    assert http_url(server, path) == url


def test_an_unusable_server_says_what_it_takes() -> None:
    with pytest.raises(ValueError, match=r"server must be an http\(s\):// URL with a host"):
        http_url("ftp://x")
    with pytest.raises(ValueError, match="invalid port"):
        http_url("http://127.0.0.1:99999")
