"""Ming-flash-omni-2.0's image side, as far as it is built: the Qwen3-VL-style ViT and
projector (`ming_flash_omni/vision.py`) on the tiny checkpoint's `vision.safetensors`, and
the thinker's `MultiRouter` routing of image / audio positions (`token_modality`) through
`image_gate` / `audio_gate`, checked on the tiny thinker in float64 (sync = async, alone =
batched, chunked = whole with coded prompts). Image prompts are not served yet: the
reference's 3-D `video_rope` positions are not built (docs/ming_flash_omni.md).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from omnistage import SamplingParams
from omnistage.config import EngineConfig
from omnistage.engine.llm_engine import LLMEngine
from omnistage.families.ming_flash_omni.config import BailingMM2Config, BailingMoeV2Config
from omnistage.families.ming_flash_omni.input_encoder import MingFlashInputEncoder
from omnistage.families.ming_flash_omni.rope import image_positions, video_rope_rows
from omnistage.families.ming_flash_omni.tiny import THINKER, make_tiny_ming_flash_omni
from omnistage.families.ming_flash_omni.tiny_vision import TINY_VISION, VISION_WEIGHTS
from omnistage.families.ming_flash_omni.vision import MingFlashImageEncoder
from omnistage.families.ming_omni.thinker import AUDIO, IMAGE
from omnistage.layers.forward_context import forward_context
from tests.test_token_modality import run as run_with_modality

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
    """Each request's ids and the logits of its every sampling step (sampled)."""
    return run_with_modality(eng, names, prompts, SAMPLED)


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


def _picture(seed: int, size: tuple[int, int]):
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (size[1], size[0], 3), generator=g, dtype=torch.uint8)
    return Image.fromarray(data.numpy())


def test_image_positions_follow_the_reference_rope_index():
    # ids: 3 text, <image>(7) 6 patches (grid 1x4x6 over merge 2: 2x3), </image>, 2 text.
    p = 9
    ids = [1, 2, 3, 7] + [p] * 6 + [8, 4, 5]
    positions, delta = image_positions(ids, p, torch.tensor([[1, 4, 6]]), 2)
    text = [0, 1, 2, 3]
    assert positions[:, :4].tolist() == [text, text, text]
    assert positions[0, 4:10].tolist() == [4] * 6  # t
    assert positions[1, 4:10].tolist() == [4, 4, 4, 5, 5, 5]  # rows
    assert positions[2, 4:10].tolist() == [4, 5, 6, 4, 5, 6]  # columns
    assert positions[:, 10:].tolist() == [[7, 8, 9]] * 3  # on from the largest + 1
    assert delta == 10 - len(ids)
    rows = video_rope_rows(BailingMoeV2Config(**dict(THINKER, moe_intermediate_size=32)))
    assert rows.tolist() == [1, 2, 0, 0]  # [2, 1, 1]: H, W, then T


@pytest.fixture(scope="module")
def encoder(ckpt):
    return MingFlashInputEncoder.from_checkpoint(ckpt, torch.float64)


def test_encoded_image_prompt_expands_routes_and_places_the_rows(encoder):
    enc = encoder.encode(
        "look: <image> and <image>?", images=[_picture(0, (64, 96)), _picture(1, (40, 40))]
    )
    ids, patch = enc.prompt_token_ids, encoder.ids["<imagePatch>"]
    counts = encoder.images.num_tokens(enc.image_grid_thw)
    assert ids.count(patch) == sum(counts) and enc.uses_mrope
    assert torch.equal(enc.token_modality, (torch.tensor(ids) == patch).long() * IMAGE)
    start = ids.index(patch)
    assert ids[start - 1] == encoder.ids["<image>"]
    assert ids[start + counts[0]] == encoder.ids["</image>"]
    assert not torch.equal(enc.mrope_positions[1], enc.mrope_positions[0])
    with pytest.raises(ValueError, match="image"):
        encoder.encode("no placeholder", images=[_picture(0, (64, 64))])
    with pytest.raises(ValueError, match="audio"):
        encoder.encode("hi", audios=[b"x"])


def _run_encoded(eng: LLMEngine, encoded: dict) -> dict[str, tuple]:
    logits: dict[str, list[torch.Tensor]] = {}

    def observe(event) -> None:
        for i, rid in enumerate(event.req_ids):
            logits.setdefault(rid, []).append(event.logits[i].clone())

    eng.core.executor.runner.add_sample_observer(observe)
    for name, enc in encoded.items():
        eng.add_encoded_request(name, enc, SAMPLED)
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return {n: (done[n], torch.stack(logits[n])) for n in encoded}


def test_float64_image_prompts_sync_async_alone_batched_chunked_equal(ckpt, encoder):
    encoded = {
        "one": encoder.encode("a <image> b", images=[_picture(2, (64, 64))]),
        "two": encoder.encode(
            "<image><image> c", images=[_picture(3, (32, 64)), _picture(4, (64, 32))]
        ),
        "text": encoder.encode("just text here"),
    }
    sync = _run_encoded(engine(ckpt), encoded)
    asyn = _run_encoded(engine(ckpt, async_scheduling=True), encoded)
    chunked = _run_encoded(engine(ckpt, max_num_batched_tokens=16, async_scheduling=True), encoded)
    for name in encoded:
        assert sync[name][0] == asyn[name][0] and torch.equal(sync[name][1], asyn[name][1]), name
        alone = _run_encoded(engine(ckpt), {name: encoded[name]})[name]
        assert alone[0] == sync[name][0], name
        torch.testing.assert_close(alone[1], sync[name][1], rtol=0, atol=1e-12)
        assert chunked[name][0] == sync[name][0], name
        torch.testing.assert_close(chunked[name][1], sync[name][1], rtol=0, atol=1e-12)
    # The 3-D positions matter: the same rows at plain positions give other logits.
    flat = dataclasses.replace(
        encoded["one"],
        mrope_positions=torch.arange(len(encoded["one"].prompt_token_ids)).expand(3, -1).clone(),
        rope_delta=0,
    )
    plain = _run_encoded(engine(ckpt), {"one": flat})
    assert not torch.allclose(plain["one"][1][0], sync["one"][1][0])


def _reference_video_rope(q, positions, theta, rotary_dim, section):
    """vLLM-Omni's `MingVideoRopeMRotaryEmbedding.forward_native`, transcribed: per-row
    cos / sin, `_remap_video_rope` (H even, W odd over the first H + W frequencies, then
    T), neox rotation of the first `rotary_dim` dims."""
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    freqs = positions.float()[..., None] * inv  # [3, T, rotary_dim / 2]
    cos, sin = freqs.cos(), freqs.sin()
    hw = section[1] + section[2]
    rc, rs = torch.empty_like(cos[0]), torch.empty_like(sin[0])
    rc[:, 0:hw:2], rc[:, 1:hw:2], rc[:, hw:] = cos[1, :, 0:hw:2], cos[2, :, 1:hw:2], cos[0, :, hw:]
    rs[:, 0:hw:2], rs[:, 1:hw:2], rs[:, hw:] = sin[1, :, 0:hw:2], sin[2, :, 1:hw:2], sin[0, :, hw:]
    rc, rs = rc[:, None].to(q.dtype), rs[:, None].to(q.dtype)
    half = rotary_dim // 2
    x1, x2 = q[..., :half], q[..., half:rotary_dim]
    return torch.cat((x1 * rc - x2 * rs, x2 * rc + x1 * rs, q[..., rotary_dim:]), dim=-1)


def test_thinker_rotary_matches_the_reference_video_rope(ckpt):
    model = engine(ckpt).core.executor.runner.model
    rotary = model.layers[0].self_attn.rotary
    config = BailingMM2Config.from_pretrained(ckpt).llm_config
    ids = [1, 2, 7] + [9] * 12 + [8, 4]
    positions, _ = image_positions(ids, 9, torch.tensor([[1, 4, 6], [1, 2, 4]]), 2)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(len(ids), 4, config.head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(len(ids), 2, config.head_dim, generator=g, dtype=torch.float64)
    got_q, got_k = rotary(positions, q, k)
    section = config.mm_rope_scaling["mrope_section"]
    for got, x in ((got_q, q), (got_k, k)):
        want = _reference_video_rope(x, positions, config.rope_theta, config.rotary_dim, section)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # Text positions (equal rows) rotate as the 1-D path does.
    flat = torch.arange(len(ids))
    torch.testing.assert_close(rotary(flat.expand(3, -1), q, k)[0], rotary(flat, q, k)[0])
