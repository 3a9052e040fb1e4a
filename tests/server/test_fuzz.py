"""Property-based fuzz of the server's own OpenAPI schema (schemathesis): requests that fit
the schema and requests that break it, on every operation, never get a 5xx, and every
error answer has OpenAI's shape.

Its own small server (context of 48 tokens, synchronous scheduling) keeps any valid
request, even n=128, to a fraction of a second; the example budget keeps the whole
fuzz well under a minute on two cores.
"""

from __future__ import annotations

import json
import re

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode, Response

from tests.server.conftest import TINY, LiveServer

MAX_EXAMPLES = 120


@pytest.fixture(scope="module")
def fuzz_server(tiny_llama):
    with LiveServer(str(tiny_llama), TINY, max_model_len=48, async_scheduling=False) as live:
        yield live


def _check(response: Response, path: str) -> None:
    assert response.status_code < 500, (path, response.status_code, response.text[:500])
    content_type = (response.headers.get("content-type") or [""])[0]
    if response.status_code >= 400:
        error = json.loads(response.text)["error"]
        assert {"message", "type", "param", "code"} <= set(error), response.text
        assert error["message"], response.text
        assert not re.search(r"0x[0-9a-f]{6,}|Traceback", response.text), response.text
    elif content_type.startswith("text/event-stream"):
        events = [line for line in response.text.split("\n") if line]  # SSE: only \n ends a line
        if not getattr(response, "stream_cut_short", False):  # schemathesis stops after 20 events
            assert events[-1] == "data: [DONE]"
        for event in events[:-1]:
            body = json.loads(event.removeprefix("data: "))
            assert "error" not in body, event


@pytest.mark.slow
def test_fuzz_openapi_schema_finds_no_5xx(fuzz_server):
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 6
    strategy = st.one_of(
        [op.as_strategy(generation_mode=mode) for op in operations for mode in GenerationMode]
    )
    session = requests.Session()

    @given(case=strategy, served_model=st.booleans())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case, served_model: bool) -> None:
        if served_model and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = TINY  # else nearly every request is an unknown model's 404
        response = case.call(base_url=fuzz_server.url, session=session, timeout=30)
        _check(response, case.path)

    fuzz()
    fuzz_server.wait_idle()  # streams cut short by the fuzzer were aborted and freed
