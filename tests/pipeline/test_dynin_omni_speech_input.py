"""Dynin-Omni's speech input (s2t) on the tiny checkpoint: a 16 kHz clip -> EMOVA units (the
S2U checked against EMOVA's code in tests/models/test_dynin_omni_s2u_reference.py) ->
vLLM-Omni's s2t prompt (`build_s2t_input_ids`, restated here) -> `mmu_generate`'s text
(the same fill as text requests, checked against Dynin's in the mmu reference test).

- the prompt ids are the reference layout, with the reference's units (reduced);
- offline (`multi_modal_data={"audio": ...}`, and a chat with an `input_audio` part) the
  answer is token2text's own answer to that prompt; alone = batched beside text and another
  clip (float64); the clip matters;
- bad audio fails its request naming the field, and the pipeline serves on.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.families.dynin_omni.tiny import make_tiny_dynin_omni
from omnistage.families.dynin_omni.token2text import DyninToken2Text
from omnistage.models.generation import GenerationItem
from omnistage.pipeline.deploy import load_deploy, packaged_deploy_path
from omnistage.pipeline.omni import Omni

FIXTURE = Path(__file__).parents[1] / "fixtures" / "dynin_omni" / "s2u_reference.npz"


@pytest.fixture(scope="module")
def reference() -> dict:
    return dict(np.load(FIXTURE))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_dynin_omni(tmp_path_factory.mktemp("dynin") / "tiny", seed=0)


@pytest.fixture(scope="module")
def model(checkpoint):
    return DyninToken2Text.from_checkpoint(checkpoint, None, torch.float64)


def deploy(checkpoint, dtype: str = "float64"):
    spec = load_deploy(packaged_deploy_path("dynin-omni")).with_model(str(checkpoint))
    return dataclasses.replace(spec.with_engine_args({"dtype": dtype}))


def _reduced(units: np.ndarray) -> list[int]:
    out: list[int] = []
    for u in units.tolist():
        if not out or out[-1] != u:
            out.append(u)
    return out


def _answer(model: DyninToken2Text, item: GenerationItem) -> str:
    (out,) = model.generate([item])
    return model.tokenizer.decode(out.tolist(), skip_special_tokens=True)


def test_the_s2t_prompt_is_the_reference_layout(model, reference):
    cfg, tok = model.cfg, model.tokenizer
    for i, instruction in ((0, "Transcribe the given audio."), (2, "What does the speaker say?")):
        item = GenerationItem(model.prompt_rows(instruction, None), meta={"modalities": ["text"]})
        model.take_audios(item, [reference[f"wav_{i}"]])
        # build_s2t_input_ids: [<|s2t|>, <|soa|>] + units + offset + [<|eoa|>] + tokenizer(chat)
        chat = (
            "<|start_header_id|>user<|end_header_id|>\n"
            f"{instruction}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
        )
        offset = cfg.llm_vocab_size + cfg.codebook_size
        want = [
            cfg.s2t_token_id,
            tok.convert_tokens_to_ids("<|soa|>"),
            *[u + offset for u in _reduced(reference[f"units_{i}"])],
            tok.convert_tokens_to_ids("<|eoa|>"),
            *tok(chat).input_ids,
        ]
        assert item.rows.tolist() == want
    item = GenerationItem(model.prompt_rows("", None), meta={"modalities": ["text"]})
    model.take_audios(item, [reference["wav_0"]])
    assert tok.decode(item.rows.tolist()).count(cfg.s2t_instruction) == 1  # the default


def test_units_unreduced_when_the_config_says_so(model, reference):
    units = model.speech_units
    units.reduce = False
    try:
        assert units(reference["wav_2"]).tolist() == reference["units_2"].tolist()
    finally:
        units.reduce = True
    assert units(reference["wav_2"]).tolist() == _reduced(reference["units_2"])


def _wav_b64(clip: np.ndarray) -> str:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((np.clip(clip, -1, 1) * 32767).astype("<i2").tobytes())
    return base64.b64encode(buf.getvalue()).decode()


def test_speech_questions_offline_alone_equal_batched_float64(checkpoint, model, reference):
    clips = [reference["wav_2"], reference["wav_0"]]
    prompts = [
        {"prompt": "Transcribe the given audio.", "multi_modal_data": {"audio": (clips[0], 16000)}},
        "hello",
        {"prompt": "Transcribe the given audio.", "multi_modal_data": {"audio": (clips[1], 16000)}},
    ]
    with Omni(deploy(checkpoint), in_process=True) as omni:
        batched = omni.generate(prompts, modalities=["text"])
        alone = [omni.generate(p, modalities=["text"])[0] for p in prompts]
        chat = omni.generate(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "input_audio",
                                "input_audio": {"data": _wav_b64(clips[0]), "format": "wav"},
                            },
                            {"type": "text", "text": "Transcribe the given audio."},
                        ],
                    }
                ]
            },
            modalities=["text"],
        )[0]
        assert all(v == 0 for s in omni.stage_counters().values() for v in s.values())
    for a, b in zip(alone, batched, strict=True):
        assert a.error is None and b.error is None, (a.error, b.error)
        assert a.text == b.text and set(a.outputs) == {"token2text"}
    for i in (0, 2):
        item = GenerationItem(model.prompt_rows("Transcribe the given audio.", None))
        item.meta["modalities"] = ["text"]
        model.take_audios(item, [prompts[i]["multi_modal_data"]["audio"][0]])
        assert alone[i].text == _answer(model, item)
    assert chat.error is None and chat.text  # the clip went through 16-bit WAV: its own units
    # The clip matters: the prompts differ, and so do these answers.
    assert alone[0].text != alone[2].text


def test_bad_audio_names_the_field_and_the_pipeline_serves_on(checkpoint, reference):
    clip = reference["wav_0"]
    with Omni(deploy(checkpoint, dtype="float32"), in_process=True) as omni:
        (out,) = omni.generate(
            {"prompt": "x", "multi_modal_data": {"audio": [(clip, 16000), (clip, 16000)]}},
            modalities=["text"],
        )
        assert (
            out.error is not None and "multi_modal_data" in out.error and "one audio" in out.error
        )
        (out,) = omni.generate(
            {"prompt": "x", "multi_modal_data": {"audio": (clip, 16000)}}, modalities=["audio"]
        )
        assert out.error is not None and "modalities" in out.error
        long = np.zeros(16000 * 61, dtype=np.float32)
        (out,) = omni.generate(
            {"prompt": "x", "multi_modal_data": {"audio": (long, 16000)}}, modalities=["text"]
        )
        assert out.error is not None and "s2t_max_seconds" in out.error
        with pytest.raises(ValueError, match="audio"):
            omni.generate({"prompt": "x", "multi_modal_data": {"audio": (clip[:10], 16000)}})
        (out,) = omni.generate("hello", modalities=["text"])
        assert out.error is None and out.text


def test_speech_questions_take_the_s2t_settings(model, reference):
    """vLLM-Omni's s2t shape (blocks of 2, several steps a block: the tiny 8 tokens, 8 steps),
    not the text settings (the tiny 8 tokens, 4 steps, blocks of 4)."""
    from omnistage.families.dynin_omni.unmask import fill_masks

    cfg = model.cfg
    assert (cfg.s2t_block_length, cfg.s2t_steps) != (cfg.text_block_length, cfg.text_steps)
    item = GenerationItem(model.prompt_rows("Transcribe the given audio.", None))
    item.meta["modalities"] = ["text"]
    model.take_audios(item, [reference["wav_2"]])
    prompt = item.rows.clone()
    (out,) = model.generate([item])
    n = cfg.s2t_max_new_tokens
    masks = torch.full((n,), cfg.mask_token_id, dtype=torch.long)
    x = fill_masks(
        model.lm,
        torch.cat([prompt, masks]),
        prompt.numel(),
        n,
        mask_id=cfg.mask_token_id,
        block_length=cfg.s2t_block_length,
        steps=cfg.s2t_steps,
    )
    answer = x[prompt.numel() :].tolist()
    if cfg.eos_token_id in answer:
        answer = answer[: answer.index(cfg.eos_token_id)]
    assert out.tolist() == answer
