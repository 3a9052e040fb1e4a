"""A server whose engine speculates: same completions, and the acceptance counters in /metrics."""

from __future__ import annotations

import httpx

from tests.server.conftest import LiveServer


def test_speculating_server_reports_acceptance_counters(tiny_llama):
    spec = {"method": "draft_model", "model": str(tiny_llama), "num_speculative_tokens": 3}
    with LiveServer(
        str(tiny_llama), "tiny-spec", speculative_config=spec, async_scheduling=False
    ) as server:
        client = server.openai()
        out = client.completions.create(
            model="tiny-spec", prompt="hello there", max_tokens=16, temperature=0
        )
        assert out.usage.completion_tokens == 16
        text = httpx.get(f"{server.url}/metrics").text
    lines = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("omnistage_spec_decode")
    }
    drafts = lines['omnistage_spec_decode_num_draft_tokens_total{stage="llm"}']
    accepted = lines['omnistage_spec_decode_num_accepted_tokens_total{stage="llm"}']
    assert drafts > 0 and accepted == drafts  # the target as its own draft accepts all (greedy)
    assert (
        lines['omnistage_spec_decode_num_accepted_tokens_per_pos_total{position="0",stage="llm"}']
        > 0
    )
