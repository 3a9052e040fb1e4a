"""Ming-Omni's checkpoint, config and talker prompt, piece by piece (no pipeline).

- The tiny checkpoint holds exactly the reference's weight names (thinker `model.*`,
  talker `talker.*`) and its talker part ends at `<audio_eos>` with the resized vocabulary.
- Config fields we cannot serve are ValueErrors naming the field.
- The talker prompt has the reference's layout: speech + text ids summed, the projected
  thinker rows and the speaker row in their placeholders, the reply's text ids as the
  per-step rows, every prompt position at `P - 1`; a reply without text and rows of the
  wrong shape are refused.
- `norm_head`: the thinker's head is normalized column-wise when loaded.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from omnistage.families.ming_omni.config import (
    BailingMMConfig,
    BailingMoeConfig,
    BailingTalkerConfig,
)
from omnistage.families.ming_omni.prompt import MingTalkerPrompter
from omnistage.families.ming_omni.tiny import AUDIO_VOCAB, make_tiny_ming_omni


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_ming_omni(tmp_path_factory.mktemp("ming-parts"), dtype=torch.float64)


@pytest.fixture(scope="module")
def prompter(ckpt):
    return MingTalkerPrompter.from_checkpoint(ckpt, torch.float64)


def test_checkpoint_has_the_reference_names_and_parts(ckpt):
    from omnistage.models.registry import auto_config

    with safe_open(ckpt / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert {n.split(".")[0] for n in names} == {"model", "talker"}
    for name in (
        "model.model.word_embeddings.weight",
        "model.model.layers.1.attention.query_key_value.weight",
        "model.model.layers.1.attention.dense.weight",
        "model.model.layers.1.mlp.gate.weight",
        "model.model.layers.1.mlp.image_gate.weight",
        "model.model.layers.1.mlp.audio_gate.weight",
        "model.model.layers.1.mlp.experts.3.down_proj.weight",
        "model.model.layers.1.mlp.shared_experts.up_proj.weight",
        "model.lm_head.weight",
        "talker.model.model.embed_tokens.weight",
        "talker.model.model.layers.0.self_attn.q_proj.bias",
        "talker.model.lm_head.weight",
        "talker.thinker_to_talker_proj.weight",
        "talker.vp_head.weight",
    ):
        assert name in names, name
    config = auto_config(ckpt)
    assert isinstance(config, BailingMMConfig)
    talker = config.talker_qwen2
    assert talker.vocab_size == 270 + AUDIO_VOCAB
    assert talker.eos_token_id == 267  # <audio_eos>: after 3 + 256 byte-level ids, 9th special


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: BailingMoeConfig(hidden_act="gelu"), "llm_config.hidden_act"),
        (lambda: BailingMoeConfig(rope_scaling={"type": "linear"}), "llm_config.rope_scaling"),
        (lambda: BailingTalkerConfig(vp_kernel_size=2), "talker_config.vp_kernel_size"),
        (lambda: BailingMMConfig().talker_qwen2, "talker_config"),
    ],
)
def test_unservable_config_fields_are_value_errors_naming_them(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_talker_prompt_layout(prompter):
    t, hidden = 5, 64
    rows = torch.randn(t + 3, 2 * hidden, dtype=torch.float64)
    reply = prompter.thinker_tok.encode("hey", add_special_tokens=False)
    got = prompter.build(t, reply + [2], rows, speaker="luna")
    ids = prompter.ids
    text = prompter.talker_tok.encode("hey", add_special_tokens=False)
    p = t + 8
    assert got.prompt_token_ids[:3] == [ids["<prompt>"], ids["</prompt>"], ids["<thinker_prefix>"]]
    assert got.prompt_token_ids[-1] == ids["<audio_bos>"] and len(got.prompt_token_ids) == p
    embed = prompter.embed
    last = embed[ids["<audio_bos>"]] + embed[text[0]]
    torch.testing.assert_close(got.prompt_embeds[-1], last, rtol=0, atol=0)
    thinker = rows[:t, :hidden] + rows[:t, hidden:]
    projected = F.linear(thinker, prompter.proj_w, prompter.proj_b)
    torch.testing.assert_close(got.prompt_embeds[3 : 3 + t], projected, rtol=0, atol=0)
    vp = F.linear(prompter.speakers["luna"], prompter.vp_w[:, :, 0], prompter.vp_b)[0]
    torch.testing.assert_close(got.prompt_embeds[t + 5], vp, rtol=1e-12, atol=1e-12)
    assert torch.equal(got.conditioning, embed[torch.tensor(text[1:] + [ids["<text_eos>"]])])
    assert torch.equal(got.fill, embed[ids["<text_pad>"]])
    positions = got.mm_decoder_inputs.mrope_positions
    assert positions.shape == (3, p) and bool((positions == p - 1).all())
    assert got.mm_decoder_inputs.rope_delta == 0


def test_talker_prompt_refuses_what_it_cannot_speak(prompter):
    rows = torch.zeros(6, 128, dtype=torch.float64)
    with pytest.raises(ValueError, match="no text to speak"):
        prompter.build(5, [2], rows)
    with pytest.raises(ValueError, match="thinker rows"):
        prompter.build(5, [72, 2], rows[:, :127])
    with pytest.raises(ValueError, match="voice: 'nobody'"):
        prompter.build(5, [72, 2], rows, speaker="nobody")


def test_norm_head_normalizes_the_thinker_head_columns(ckpt):
    from omnistage import LLM

    llm = LLM(str(ckpt), model_part="thinker", dtype="float64", async_scheduling=False)
    model = llm.engine.core.executor.runner.model
    norms = model.lm_head.weight.norm(dim=0)
    torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=1e-6)
