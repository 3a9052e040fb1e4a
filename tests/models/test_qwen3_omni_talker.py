"""The Qwen3-Omni talker's decoder (a part of the real checkpoint) on our hot path:
for the same input embeddings, the same codec logits as transformers' talker.

Only the decoder is checked here; how the talker's inputs are assembled (projected
thinker embeddings and hidden states, codec embeddings, one thinker token per step)
and the code predictor's residual codebooks are still to be built
(see docs/qwen3_omni_reference.md)."""

from __future__ import annotations

import pytest
import torch

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine
from omnistage.families.qwen3_omni.tiny import make_tiny_qwen3_omni


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_qwen3_omni(tmp_path_factory.mktemp("qwen3-omni-talker"), dtype=torch.float64)


def test_talker_decoder_logits_match_transformers(ckpt):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    ref = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float64, experts_implementation="eager"
    ).talker.eval()
    engine = LLMEngine(
        EngineConfig(model=str(ckpt), model_part="talker", dtype="float64", async_scheduling=False)
    )
    runner = engine.core.executor.runner
    seen: list[torch.Tensor] = []
    runner.add_sample_observer(lambda event: seen.append(event.logits))
    hidden = ref.config.text_config.hidden_size
    g = torch.Generator().manual_seed(0)
    embeds = [torch.randn(n, hidden, generator=g, dtype=torch.float64) for n in (9, 17, 4)]
    for i, e in enumerate(embeds):
        engine.add_tokenized_request(
            f"r{i}", None, [5] * e.shape[0], SamplingParams(temperature=0, max_tokens=1), e
        )
    while engine.has_unfinished_requests():
        engine.step()
    (logits,) = seen
    for i, e in enumerate(embeds):
        with torch.no_grad():
            expected = ref.codec_head(ref.model(inputs_embeds=e[None]).last_hidden_state)[0, -1]
        torch.testing.assert_close(logits[i].double(), expected, rtol=1e-4, atol=1e-4)
    assert logits.shape[-1] == ref.config.text_config.vocab_size
