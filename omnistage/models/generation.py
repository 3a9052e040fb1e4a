"""Generation-stage models: whole inputs in one forward pass (vocoders, decoders).

A `GenerationModel` turns a request's input rows (e.g. codec codes) into its
output (e.g. a waveform) in one call, for a batch of requests at once: one
`GenerationItem` per request. For streamed input, an item is a chunk's own
rows with up to `left_context` rows of the previous chunks in front and
`right_context` rows of the next chunk behind (see
`omnistage.pipeline.generation_stage`); the model returns only the output of
the chunk's own rows, so a model whose receptive field fits in the context
gives exactly what it would give on the whole input.

Checkpoints are directories with `config.json` (naming `architectures`) and
`model.safetensors`, so loading reads the same layout as the AR models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import safetensors.torch
import torch
from torch import nn

from omnistage.layers.linear import Embedding, Linear


@dataclass
class GenerationItem:
    """One request's rows for one `GenerationModel.generate` call: its whole input, or a
    stream chunk with context around it. The model returns the output of the item's own
    rows, `rows[context_len : own_end]`, only."""

    rows: torch.Tensor
    """`context_len` rows of context, the own rows, then `lookahead_len` rows of context."""

    context_len: int = 0
    """Leading rows of the request's earlier chunks (left context): seen, not output again."""

    lookahead_len: int = 0
    """Trailing rows of the request's next chunk (right context): seen, not output yet."""

    offset: int = 0
    """Index of `rows[0]` in the request's whole input (0 for a whole payload)."""

    seed: int | None = None
    """For models that sample noise (`takes_seeds_and_speakers`); None: the model's default."""

    speaker: str | None = None
    """For models with voices (`takes_seeds_and_speakers`); None: the model's default."""

    @property
    def own_end(self) -> int:
        """Where the own rows end in `rows`."""
        return int(self.rows.shape[0]) - self.lookahead_len


class GenerationModel(nn.Module):
    architectures: ClassVar[tuple[str, ...]] = ()
    output_modality: ClassVar[str] = "audio"
    sample_rate: int | None = None
    takes_seeds_and_speakers: ClassVar[bool] = False
    """Whether the model reads `GenerationItem.seed` and `.speaker` (a vocoder that samples
    noise, with voices); the generation stage then gives every request a seed."""

    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        """Per item: the output of its own rows (see `GenerationItem`)."""
        raise NotImplementedError


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


def load_part_module(module: nn.Module, path: Path, prefix: str, what: str) -> None:
    """Load the checkpoint weights under `prefix` (e.g. "code2wav.") into `module`, which
    must take exactly those (ValueError naming what is missing or unexpected)."""
    from omnistage.models.loader import iter_weights

    state = {name[len(prefix) :]: tensor for name, tensor in iter_weights(path, [prefix])}
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path}: {what} weights do not match (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]})"
        )


_GENERATION_MODELS: dict[str, type[GenerationModel]] = {}


def register_generation_model(cls: type[GenerationModel]) -> type[GenerationModel]:
    for arch in cls.architectures:
        _GENERATION_MODELS[arch] = cls
    return cls


register_generation_model(TinyCodeVocoder)


def load_generation_model(
    path: str | Path, dtype: torch.dtype, part: str | None = None
) -> GenerationModel:
    """Build the model a checkpoint directory's config.json names, with its weights
    (or, with `part`, that part of a multi-part checkpoint, e.g. Qwen3-Omni's code2wav)."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"model: {path} has no config.json")
    config = json.loads(config_file.read_text())
    if part is not None:
        return _load_part(path, config, part, dtype)
    archs = config.get("architectures") or []
    cls = next((_GENERATION_MODELS[a] for a in archs if a in _GENERATION_MODELS), None)
    if cls is None:
        raise ValueError(
            f"architectures: {archs or 'none given'} is not a generation model; "
            f"supported: {', '.join(sorted(_GENERATION_MODELS))}"
        )
    model = cls(config, dtype)
    state = safetensors.torch.load_file(str(path / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path}: checkpoint does not match {cls.__name__} "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    return model.eval()


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
    ("qwen3_omni_moe", "code2wav"): "omnistage.models.qwen3_omni_code2wav:Qwen3OmniCode2Wav",
    ("qwen2_5_omni", "token2wav"): "omnistage.models.qwen25_omni_token2wav:Qwen25OmniToken2Wav",
}
"""(checkpoint model_type, part) -> the generation model serving that part of it; each
has `from_checkpoint(path, hf_config, dtype)`."""


def _load_part(
    path: Path, config: dict[str, Any], part: str, dtype: torch.dtype
) -> GenerationModel:
    import importlib

    import transformers

    model_type = config.get("model_type")
    target = GENERATION_PARTS.get((model_type, part))
    if target is None:
        raise ValueError(f"model_part: {model_type!r} checkpoints have no generation part {part!r}")
    module, name = target.split(":")
    cls = getattr(importlib.import_module(module), name)
    hf_config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    return cls.from_checkpoint(path, hf_config, dtype)
