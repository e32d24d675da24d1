"""Schemathesis against the server's own OpenAPI schema, on a real `gradwatch serve` holding a
real run: whatever the generated parameters and bodies, no response is a 5xx."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from support.server import ServerProcess, start_server
from support.wiremsg import Hook, close, f32, hello, step

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(tmp_path_factory.mktemp("fuzz"))
    with Hook(server.ws_url) as hook:  # a real run, so that some generated ids and names exist
        hook.call(hello("fuzzrun"))
        for i in range(1, 6):
            hook.call(
                step(i, i, scalars={"loss": 1.0 / i}, arrays={"grad_norm": f32(0.5, float("inf"))}, grad_status=[2, 3])
            )
        hook.call(close(6))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def api_schema(api_server: ServerProcess):
    return schemathesis.openapi.from_url(f"{api_server.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_generated_request_gets_a_server_error(case, api_server: ServerProcess) -> None:
    case.call_and_validate(base_url=api_server.url, checks=[not_a_server_error])


def test_an_offset_past_64_bits_is_refused_not_a_crash(api_server: ServerProcess) -> None:
    """Found by the fuzzing above: a huge `offset` overflowed the database's integer (500)."""
    import httpx

    res = httpx.get(f"{api_server.url}/api/runs", params={"offset": 10**26}, timeout=10)
    assert res.status_code == 422 and "offset" in res.text


def test_the_fuzzed_run_is_still_whole(api_server: ServerProcess) -> None:
    """Runs after the fuzzing: reads of the seeded run still work (it may have been renamed or
    deleted by a generated request: the server has no token here, so both are allowed)."""
    import httpx

    res = httpx.get(f"{api_server.url}/api/runs/fuzzrun", timeout=10)
    assert res.status_code in (200, 404)
    if res.status_code == 200:
        assert res.json()["steps"] == 5
