"""Covo-Audio's configs and checkpoint checks: the released token2wav settings (used when a
checkpoint's `token2wav/` has no config.json), bad settings and missing files as
ValueErrors naming what is wrong, and the tiny checkpoint's names matching the reference's
(`CovoAudioForCausalLM` and `Token2WavDecoder` load it with nothing missing or left over,
checked by the fixture script; here: every tensor of ours is in the files)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from omnistage.families.covo_audio.code2wav import CovoAudioCode2Wav
from omnistage.families.covo_audio.config import (
    RELEASED_TOKEN2WAV,
    CovoAudioConfig,
    Token2WavConfig,
)
from omnistage.families.covo_audio.tiny import TOKEN2WAV, make_tiny_covo_audio


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_covo_audio(tmp_path_factory.mktemp("covo") / "tiny")


def test_the_released_token2wav_settings():
    config = Token2WavConfig.from_dict(RELEASED_TOKEN2WAV)
    # 4 latent frames per code, 240 samples per frame: 25 codes a second at 24 kHz.
    assert config.dit.upsample_factor * config.vocoder.hop == 960
    assert config.sample_rate == 24000 and config.steps == 10 and config.cfg_alpha == 1.0
    assert config.dit.token_vocab_size == 16384


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda c: c["model"]["wavegan"].update(activation="snake"), "model.wavegan"),
        (lambda c: c["model"]["wavegan"].update(upsample_kernel_sizes=[4, 5]), "upsample_kernel"),
        (lambda c: c["model"]["wavegan"].update(latent_dim=4), "latent_dim"),
        (lambda c: c["model"]["token2latent"].update(upsample_factor=1), "upsample_factor"),
        (lambda c: c["model"]["token2latent"]["transformer"].update(num_heads=3), "hidden_size"),
        (lambda c: c["model"]["token2latent"]["transformer"].update(alibi_bias=True), "rotary"),
        (lambda c: c["inference"].update(rescale_logits=True), "rescale_logits"),
    ],
)
def test_bad_token2wav_settings_name_the_field(edit, field):
    raw = copy.deepcopy(TOKEN2WAV)
    edit(raw)
    with pytest.raises(ValueError, match=field):
        Token2WavConfig.from_dict(raw)


def test_missing_or_bad_files_are_value_errors(checkpoint, tmp_path):
    config = CovoAudioConfig.from_pretrained(checkpoint)
    assert config.llm_config.vocab_size == config.audio_token_index + 64
    folder = checkpoint / "token2wav"
    saved = torch.load(folder / "model.pt", weights_only=True)
    broken = tmp_path / "t2w"
    (broken / "token2wav" / "prompt").mkdir(parents=True)
    for name in ("global_mean_var.npy", "config.json"):
        (broken / "token2wav" / name).write_bytes((folder / name).read_bytes())
    with pytest.raises(ValueError, match="model.pt is missing"):
        CovoAudioCode2Wav.from_checkpoint(broken, config, torch.float32)
    torch.save(
        {k: v for k, v in saved.items() if "conv_post" not in k}, broken / "token2wav" / "model.pt"
    )
    with pytest.raises(ValueError, match="speaker prompt"):
        CovoAudioCode2Wav.from_checkpoint(broken, config, torch.float32)
    for name in ("prompt_token.npy", "prompt_latent.npy", "speaker_embed.npy"):
        (broken / "token2wav" / "prompt" / name).write_bytes(
            (folder / "prompt" / name).read_bytes()
        )
    with pytest.raises(ValueError, match=r"missing \['wavegan.conv_post"):
        CovoAudioCode2Wav.from_checkpoint(broken, config, torch.float32)
    (broken / "token2wav" / "config.json").write_text(json.dumps({"model": {}}))
    with pytest.raises(ValueError, match="config.json"):
        CovoAudioCode2Wav.from_checkpoint(broken, config, torch.float32)
