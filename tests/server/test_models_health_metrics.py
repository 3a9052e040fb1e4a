"""GET /v1/models, /health and /metrics."""

from __future__ import annotations

import re

from tests.server.conftest import TINY


def test_models(client, http):
    (card,) = client.models.list().data
    assert card.id == TINY and card.object == "model" and card.owned_by == "omnistage"
    assert client.models.retrieve(TINY).id == TINY
    listed = http.get("/v1/models").json()["data"][0]
    assert listed["max_model_len"] == 256
    # What the model takes and makes (extensions; the playground reads them).
    assert listed["input_modalities"] == ["text"] and listed["output_modalities"] == ["text"]
    assert listed["chat_modalities"] == ["text"]


def test_health(http):
    response = http.get("/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_after_requests(client, http, server):
    before = _samples(http.get("/metrics").text)
    client.completions.create(
        model=TINY, prompt="abc", max_tokens=5, extra_body={"ignore_eos": True}
    )
    list(client.completions.create(model=TINY, prompt="abc", max_tokens=5, stream=True))
    http.post("/v1/completions", json={"model": TINY, "prompt": "x", "bogus": 1})
    server.wait_idle()
    response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    after = _samples(response.text)

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    route = 'method="POST",route="/v1/completions"'
    assert grew(f'omnistage_http_requests_total{{{route},status="200"}}') == 2
    assert grew(f'omnistage_http_requests_total{{{route},status="400"}}') == 1
    assert grew('omnistage_generation_tokens_total{stage="llm"}') >= 6
    assert grew('omnistage_prompt_tokens_total{stage="llm"}') == 6
    assert grew('omnistage_time_to_first_token_seconds_count{stage="llm"}') == 2
    assert grew('omnistage_inter_token_latency_seconds_count{stage="llm"}') >= 4
    assert grew('omnistage_e2e_request_latency_seconds_count{stage="llm"}') == 2
    assert grew('omnistage_requests_finished_total{reason="length",stage="llm"}') >= 1
    for gauge in ("num_requests_waiting", "num_requests_running", "kv_cache_usage_ratio"):
        assert after[f'omnistage_{gauge}{{stage="llm"}}'] == 0
    assert re.search(
        r'omnistage_time_to_first_token_seconds_bucket\{le="0.1",stage="llm"\}', response.text
    )
