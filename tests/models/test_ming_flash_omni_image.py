"""Ming-flash-omni-2.0's image side, as far as it is built: the Qwen3-VL-style ViT and
projector (`ming_flash_omni/vision.py`) on the tiny checkpoint's `vision.safetensors`, and
the thinker's `MultiRouter` routing of image / audio positions (`token_modality`) through
`image_gate` / `audio_gate`, checked on the tiny thinker in float64 (sync = async, alone =
batched, chunked = whole with coded prompts). Image prompts are not served yet: the
reference's 3-D `video_rope` positions are not built (docs/ming_flash_omni.md).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.engine.llm_engine import LLMEngine
from omnistage.families.ming_flash_omni.config import BailingMM2Config
from omnistage.families.ming_flash_omni.tiny import make_tiny_ming_flash_omni
from omnistage.families.ming_flash_omni.tiny_vision import TINY_VISION, VISION_WEIGHTS
from omnistage.families.ming_flash_omni.vision import MingFlashImageEncoder
from omnistage.families.ming_omni.thinker import AUDIO, IMAGE
from omnistage.layers.forward_context import forward_context

L = 40
GRID = torch.tensor([[1, 4, 6], [1, 2, 2]])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_ming_flash_omni(tmp_path_factory.mktemp("ming-flash-image"), seed=0)


def pixels(seed: int = 0) -> torch.Tensor:
    patch = 3 * TINY_VISION["temporal_patch_size"] * TINY_VISION["patch_size"] ** 2
    n = int(GRID.prod(dim=-1).sum())
    return torch.randn(n, patch, generator=torch.Generator().manual_seed(seed))


def test_image_encoder_loads_the_reference_names_and_projects_the_main_merger(ckpt):
    config = BailingMM2Config.from_pretrained(ckpt)
    names = set(load_file(ckpt / VISION_WEIGHTS))
    for name in (
        "vision.patch_embed.proj.weight",
        "vision.pos_embed.weight",
        "vision.blocks.1.attn.qkv.weight",
        "vision.blocks.1.mlp.linear_fc2.bias",
        "vision.merger.norm.weight",
        "vision.merger.linear_fc1.weight",
        "vision.deepstack_merger_list.0.linear_fc2.weight",
        "linear_proj.0.weight",
        "linear_proj.2.bias",  # mlp_depth 2: Linear, GELU, Linear
    ):
        assert name in names, name
    enc = MingFlashImageEncoder.from_checkpoint(ckpt, config, torch.float64)
    assert set(enc.state_dict()) == names
    rows = enc(pixels(), GRID)
    assert enc.num_tokens(GRID) == [6, 1] and rows.shape == (7, config.llm_config.hidden_size)
    torch.testing.assert_close(rows.norm(dim=-1), torch.ones(7, dtype=torch.float32))
    # The projector's input is the main merger's rows (the deepstack features dropped).
    main = enc.vision(pixels().double(), grid_thw=GRID).pooler_output
    expected = torch.nn.functional.normalize(enc.linear_proj(main), dim=-1).float()
    torch.testing.assert_close(rows, expected, rtol=0, atol=1e-6)
    # Images are independent: the second image alone gives its row again.
    alone = enc(pixels()[24:], GRID[1:])
    torch.testing.assert_close(alone, rows[6:], rtol=0, atol=1e-6)


def test_bad_encoder_checkpoints_are_value_errors_naming_them(ckpt, tmp_path):
    config = BailingMM2Config.from_pretrained(ckpt)
    bad = tmp_path / "bad"
    make_tiny_ming_flash_omni(bad, seed=0)
    weights = load_file(bad / VISION_WEIGHTS)
    del weights["vision.merger.norm.weight"]
    save_file(weights, bad / VISION_WEIGHTS)
    with pytest.raises(ValueError, match=r"vision\.merger\.norm\.weight missing"):
        MingFlashImageEncoder.from_checkpoint(bad, config, torch.float32)
    for field, value in (("out_hidden_size", None), ("num_position_embeddings", 15)):
        settings = dict(TINY_VISION, **{field: value})
        with pytest.raises(ValueError, match=f"vision_config.{field}"):
            MingFlashImageEncoder(settings, 64, 2)
    no_vit = json.loads((bad / "config.json").read_text())
    no_vit["vision_config"] = None
    with pytest.raises(ValueError, match="vision_config"):
        MingFlashImageEncoder.from_checkpoint(bad, BailingMM2Config(**no_vit), torch.float32)


class _Meta:
    """A forward context that only carries codes (the MoE block reads nothing else)."""

    def __init__(self, codes: torch.Tensor | None) -> None:
        self.token_modality = codes


def engine(ckpt, **kw) -> LLMEngine:
    kw.setdefault("async_scheduling", False)
    kw.setdefault("executor_backend", "thread")
    return LLMEngine(EngineConfig(model=str(ckpt), model_part="thinker", dtype="float64", **kw))


def test_multirouter_routes_image_and_audio_positions_through_their_gates(ckpt):
    model = engine(ckpt).core.executor.runner.model
    moe = next(layer.mlp for layer in model.layers if hasattr(layer.mlp, "image_gate"))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, moe.gate.weight.shape[1], generator=g, dtype=torch.float64)
    residual = torch.randn(x.shape, generator=g, dtype=torch.float64)
    kinds = torch.tensor([0, IMAGE, AUDIO, IMAGE, 0, AUDIO])

    def out(codes: torch.Tensor | None) -> torch.Tensor:
        with forward_context(_Meta(codes)):
            return moe(x.clone(), residual.clone())

    def routed_by(gate) -> torch.Tensor:  # the block with `gate`'s weight and bias as `gate`
        saved = moe.gate.weight.clone(), moe.gate.expert_bias.clone()
        moe.gate.weight.copy_(gate.weight)
        moe.gate.expert_bias.copy_(gate.expert_bias)
        try:
            return out(None)
        finally:
            moe.gate.weight.copy_(saved[0])
            moe.gate.expert_bias.copy_(saved[1])

    mixed, text = out(kinds), out(None)
    image, audio = routed_by(moe.image_gate), routed_by(moe.audio_gate)
    for i, code in enumerate(kinds.tolist()):
        expected = {0: text, IMAGE: image, AUDIO: audio}[code][i]
        torch.testing.assert_close(mixed[i], expected, rtol=0, atol=1e-12)
    assert not torch.allclose(image, text) and not torch.allclose(audio, text)


def _kinds(*spans: tuple[int, int, int]) -> torch.Tensor:
    kinds = torch.zeros(L, dtype=torch.int64)
    for start, stop, code in spans:
        kinds[start:stop] = code
    return kinds


PROMPTS = {
    "image": (list(range(20, 20 + L)), _kinds((4, 28, IMAGE))),
    "both": (list(range(100, 100 + L)), _kinds((2, 12, IMAGE), (15, 36, AUDIO))),
    "text": (list(range(150, 150 + L)), None),
}
SAMPLED = SamplingParams(temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)


def run(eng: LLMEngine, names: list[str], prompts=PROMPTS) -> dict[str, tuple]:
    """Each request's ids and the logits of its every sampling step."""
    logits: dict[str, list[torch.Tensor]] = {}

    def observe(event) -> None:
        for i, rid in enumerate(event.req_ids):
            logits.setdefault(rid, []).append(event.logits[i].clone())

    eng.core.executor.runner.add_sample_observer(observe)
    for name in names:
        ids, kinds = prompts[name]
        mm = None if kinds is None else MultimodalDecoderInputs(token_modality=kinds.clone())
        eng.add_tokenized_request(name, None, ids, SAMPLED, mm_decoder_inputs=mm)
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return {n: (done[n], torch.stack(logits[n])) for n in names}


def test_float64_coded_prompts_sync_async_alone_batched_chunked_equal(ckpt):
    names = list(PROMPTS)
    sync = run(engine(ckpt), names)
    asyn = run(engine(ckpt, async_scheduling=True), names)
    chunked = run(engine(ckpt, max_num_batched_tokens=16, async_scheduling=True), names)
    for name in names:
        assert sync[name][0] == asyn[name][0], name
        assert torch.equal(sync[name][1], asyn[name][1]), name  # bit for bit
        alone = run(engine(ckpt), [name])[name]
        assert alone[0] == sync[name][0], name
        torch.testing.assert_close(alone[1], sync[name][1], rtol=0, atol=1e-12)
        assert chunked[name][0] == sync[name][0], name
        torch.testing.assert_close(chunked[name][1], sync[name][1], rtol=0, atol=1e-12)
    # The codes matter: the image prompt without them gives other logits.
    plain = dict(PROMPTS, image=(PROMPTS["image"][0], None))
    without = run(engine(ckpt), ["image"], plain)
    assert not torch.allclose(without["image"][1][0], sync["image"][1][0])
