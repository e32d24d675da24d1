"""DNS rebinding and cross-site websockets, against a real server process."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from gradwatch_server.security import hostname
from support.server import start_server

pytestmark = pytest.mark.unit  # a test that starts a server says so (@pytest.mark.server)


@pytest.fixture(scope="module")
def loopback(tmp_path_factory: pytest.TempPathFactory):
    server = start_server(tmp_path_factory.mktemp("security"))
    yield server
    server.stop()


@pytest.mark.server
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_loopback_names_are_served(loopback, host: str) -> None:
    port = loopback.url.rsplit(":", 1)[1]
    assert httpx.get(f"{loopback.url}/api/health", headers={"Host": f"{host}:{port}"}).status_code == 200


@pytest.mark.server
@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8765", "127.0.0.1.nip.io", ""])
def test_other_host_headers_are_refused(loopback, host: str) -> None:
    r = httpx.get(f"{loopback.url}/api/runs", headers={"Host": host})
    assert r.status_code == 400
    assert "--allowed-hosts" in r.json()["detail"]


@pytest.mark.server
def test_cross_site_websockets_are_refused(loopback) -> None:
    for path in ("/ws/ingest", "/ws/live"):
        with pytest.raises(InvalidStatus) as err:
            with connect(loopback.ws_url + path, origin="http://attacker.example"):
                pass
        assert err.value.response.status_code == 403
    with connect(loopback.ws_url + "/ws/live", origin=loopback.url) as ws:  # the dashboard itself
        ws.ping().wait(5)


@pytest.mark.server
def test_allowed_hosts_adds_names(tmp_path: Path) -> None:
    server = start_server(tmp_path, env={"GRADWATCH_ALLOWED_HOSTS": "gw.internal, 127.0.0.1"})
    try:
        assert httpx.get(f"{server.url}/api/health", headers={"Host": "gw.internal"}).status_code == 200
        assert httpx.get(f"{server.url}/api/health", headers={"Host": "localhost"}).status_code == 400
    finally:
        server.stop()


@pytest.mark.parametrize(
    "value, name",
    [
        ("127.0.0.1:8765", "127.0.0.1"),
        ("[::1]:80", "::1"),
        ("LocalHost", "localhost"),
        ("http://a.b:1/x", "a.b"),
        ("[bad", ""),
    ],
)
def test_hostname(value: str, name: str) -> None:
    assert hostname(value) == name
