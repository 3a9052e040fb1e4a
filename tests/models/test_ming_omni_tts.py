"""Ming-Omni's talker speaking a text without the thinker (the talker-only deploy
`demo-ming-omni-tts`) against the inclusionAI/Ming reference, on the tiny checkpoint in
float32.

The fixture (`tests/fixtures/ming_omni/tts_reference.npz`) was written by the reference's
`omni_tts_binary_generation(text, vp_emb=luna, thinker_reply_part=None)`
(`make_tts_fixture.py` beside it says how: argmax instead of top-k sampling, `<audio_eos>`
after 12 ids) on the checkpoint `make_tiny_ming_omni(path, seed=0)` writes; the test
rebuilds it and checks the SHA-256 of `model.safetensors` and `luna.pt` first. Three texts,
one of a single byte.

- the prompt (`speech_prompt.MingSpeechPrompter`): speech prompt ids equal, the text
  side's ids (first text id in the prompt, then the rest, `<text_eos>`, `<text_pad>`)
  equal, as rows: the prompt rows are the sums of the two sides' embeddings with the
  speaker row at `<vp> <audio_pad> </vp>`;
- the whole talker -> vocoder pipeline, greedy: speech ids identical, every talker step's
  logits within 1e-4 of the reference's (measured 3.3e-6).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from omnistage import SamplingParams
from omnistage.families.ming_omni.speech_prompt import MingSpeechPrompter
from omnistage.families.ming_omni.tiny import make_tiny_ming_omni
from omnistage.pipeline.omni import Omni
from omnistage.testing.tiny_deploys import tiny_speech_deploy
from tests.models.npz_fixture import checked_checkpoint, load_npz

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ming_omni" / "tts_reference.npz"
TEXTS = ["Hello there", "A second, longer sentence to speak.", "x"]
TEXT_VOCAB = 270


@pytest.fixture(scope="module")
def fixture():
    return load_npz(FIXTURE)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, fixture):
    return checked_checkpoint(
        make_tiny_ming_omni(tmp_path_factory.mktemp("ming-tts"), seed=0), fixture
    )


@pytest.mark.parametrize("i", [0, 1, 2])
def test_the_prompt_is_the_reference_s(ckpt, fixture, i):
    prompter = MingSpeechPrompter.from_checkpoint(ckpt, torch.float32)
    msg = SimpleNamespace(prompt=TEXTS[i], voice=None, instructions=None, language=None)
    inputs, budget = prompter.request_input("talker", msg)
    assert budget is None
    speech, text = fixture[f"speech_prompt_{i}"].tolist(), fixture[f"text_prompt_{i}"].tolist()
    assert list(inputs.prompt_token_ids) == speech
    rest = fixture[f"text_rest_{i}"].tolist()
    assert prompter.text_ids(TEXTS[i]) == text[-1:] + rest[:-2]
    embed = prompter.talker.embed
    expected = embed[torch.tensor(speech)] + embed[torch.tensor(text)]
    expected[5] = prompter.talker.speaker_row("luna")
    assert torch.equal(inputs.prompt_embeds, expected)
    assert torch.equal(inputs.conditioning, embed[torch.tensor(rest[:-1])])
    assert torch.equal(inputs.conditioning_fill, embed[rest[-1]])
    positions = inputs.mm_decoder_inputs.mrope_positions
    assert positions.unique().tolist() == [len(speech) - 1]


def test_the_talker_speaks_as_the_reference(ckpt, fixture):
    spec = tiny_speech_deploy("demo-ming-omni-tts", ckpt, dtype="float32", async_scheduling=False)
    params = {
        "talker": SamplingParams(temperature=0.0, max_tokens=12),
        "vocoder": SamplingParams(seed=5),
    }
    with Omni(spec, in_process=True) as omni:
        runner = omni.orchestrator.clients["talker"].core.engine.core.executor.runner
        seen: list[torch.Tensor] = []
        runner.add_sample_observer(lambda event: seen.extend(event.logits.clone()))
        for i, text in enumerate(TEXTS):
            seen.clear()
            (out,) = omni.generate([text], params)
            assert out.error is None
            speech = [t - TEXT_VOCAB for t in out.outputs["talker"].token_ids]
            assert speech == fixture[f"speech_ids_{i}"].tolist()
            ref = torch.from_numpy(fixture[f"logits_{i}"])
            torch.testing.assert_close(torch.stack(seen), ref, rtol=1e-4, atol=1e-4)
            assert out.audio is not None and out.audio.size > 0


def test_only_the_talker_part_renders_its_own_prompt():
    """The prompter is declared for (bailingmm, bailing_talker): the omni deploy's thinker
    still takes a chat, the talker-only deploy's entry stage renders its prompt."""
    from omnistage.entrypoints.entry_prompt import entry_builds_its_prompt
    from omnistage.models import registry
    from omnistage.pipeline.deploy import load_deploy, packaged_deploy_path

    assert registry.stage_prompter_class("bailingmm", "thinker") is None
    assert registry.stage_prompter_class("bailingmm", "bailing_talker") is MingSpeechPrompter
    assert registry.stage_prompter_class("bailingmm") is None
    spec = load_deploy(packaged_deploy_path("demo-ming-omni-tts")).with_model("demo-ming-omni-tts")
    assert entry_builds_its_prompt(spec)
    spec = load_deploy(packaged_deploy_path("demo-ming-omni")).with_model("demo-ming-omni")
    assert not entry_builds_its_prompt(spec)
