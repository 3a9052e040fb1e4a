"""The tiny causal code vocoder: what stands in for a real code2wav in tests and benchmarks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

from omnistage.layers.linear import Embedding, Linear
from omnistage.models.generation import GenerationItem, GenerationModel


class TinyCodeVocoder(GenerationModel):
    """A small causal vocoder: code embeddings → causal conv stack → `samples_per_code` samples.

    Its receptive field is `num_layers * (kernel_size - 1)` codes of left context;
    it stands in for a real code2wav in pipeline tests and benchmarks.
    """

    architectures = ("OmnistageTinyCodeVocoder",)

    def __init__(self, config: dict[str, Any], dtype: torch.dtype) -> None:
        super().__init__()
        hidden, k = config["hidden_size"], config["kernel_size"]
        self.kernel_size = k
        self.embed = Embedding(config["vocab_size"], hidden, dtype=dtype)
        self.convs = nn.ModuleList(
            nn.Conv1d(hidden, hidden, k, dtype=dtype) for _ in range(config["num_layers"])
        )
        self.out = Linear(hidden, config["samples_per_code"], dtype=dtype)
        self.sample_rate = int(config["sample_rate"])
        self.receptive_field = config["num_layers"] * (k - 1)

    @torch.inference_mode()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        # Causal: the rows after a chunk's own (right context) change nothing; not decoded.
        # One item per call, as the real vocoders do: a batched convolution may sum in another
        # order than the same row alone, and a seeded audio must not depend on its neighbours.
        return [self._generate_one(item) for item in items]

    def _generate_one(self, item: GenerationItem) -> torch.Tensor:
        codes = item.rows[: item.own_end]
        if codes.numel() == 0:
            return torch.zeros(0, dtype=torch.float32)
        x = self.embed(codes.long()[None]).transpose(1, 2)  # [1, hidden, T]
        for conv in self.convs:
            x = torch.tanh(conv(nn.functional.pad(x, (self.kernel_size - 1, 0))))
        samples = torch.tanh(self.out(x.transpose(1, 2)))  # [1, T, samples_per_code]
        return samples[0, item.context_len :].reshape(-1).float()


def make_tiny_vocoder(
    path: Path, vocab_size: int = 320, seed: int = 0, samples_per_code: int = 8
) -> Path:
    """Save a seeded random `TinyCodeVocoder` checkpoint (tests, benchmarks)."""
    config = {
        "architectures": list(TinyCodeVocoder.architectures),
        "vocab_size": vocab_size,
        "hidden_size": 32,
        "kernel_size": 3,
        "num_layers": 2,
        "samples_per_code": samples_per_code,
        "sample_rate": 16000,
    }
    torch.manual_seed(seed)
    model = TinyCodeVocoder(config, torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    safetensors.torch.save_file(model.state_dict(), str(path / "model.safetensors"))
    return path


GENERATION_PARTS: dict[tuple[str, str], str] = {
    ("qwen3_omni_moe", "code2wav"): "omnistage.families.qwen3_omni.code2wav:Qwen3OmniCode2Wav",
    ("qwen2_5_omni", "token2wav"): "omnistage.families.qwen25_omni.token2wav:Qwen25OmniToken2Wav",
}
"""(checkpoint model_type, part) -> the generation model serving that part of it; each
has `from_checkpoint(path, hf_config, dtype)`."""
