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
`model.safetensors`, so loading reads the same layout as the AR models; the
families declare which class serves an architecture or a part of a checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import safetensors.torch
import torch
from torch import nn

from omnistage.models import registry


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

    last: bool = True
    """Whether no rows of the request come after these (a whole payload, or a stream's
    last chunk): models that treat a stream's end apart (a vocoder's final flush) read it."""

    state: dict[str, Any] | None = None
    """A stream's state between its chunks, the same dict with each of them (None for
    an item that is not a stream's chunk): the stage owns it and drops it with the
    stream; a model that decodes a chunk from what it kept of the ones before (instead
    of re-decoding the left context) keeps that here, in chunk order."""

    meta: dict[str, Any] = field(default_factory=dict)
    """The request's metadata carried along the pipeline (flattened prompt fields: speaker,
    language, task, …; `EdgeProcessor.to_meta`); a model that hands fields on to the next
    stage adds them here (`EdgeProcessor.from_generation` reads them)."""

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

    takes_prompts: ClassVar[bool] = False
    """Whether the model can be a pipeline's entry stage: its input rows come from the
    request's prompt (`prompt_rows`) instead of an incoming edge."""

    def prompt_rows(self, prompt: str | None, prompt_token_ids: list[int] | None) -> torch.Tensor:
        """An entry model's input rows from the request's prompt (ValueError if unusable)."""
        raise ValueError(f"{type(self).__name__} takes no prompts (it is no entry stage)")

    def take_images(self, item: GenerationItem, images: list[Any]) -> None:
        """An entry model that takes images itself (`Family.entry_media`) puts a request's
        `[H, W, 3]` uint8 images into its `item` (ValueError if unusable); the others take
        none."""
        raise ValueError(f"multi_modal_data: {type(self).__name__} takes no images")

    def take_audios(self, item: GenerationItem, audios: list[Any]) -> None:
        """The same for a request's 16 kHz mono float clips (`Family.entry_media` "audio")."""
        raise ValueError(f"multi_modal_data: {type(self).__name__} takes no audio")

    def output_text(self, item: GenerationItem, output: torch.Tensor) -> str:
        """The text of a finished item's output, for a model that writes text (Dynin-Omni's
        token2text on a text task); "" for the others (the default)."""
        return ""

    def check_item(self, item: GenerationItem) -> None:
        """Raise ValueError if `item` is no valid input (a code outside the model's table);
        the generation stage asks as each item arrives, so that its request alone fails,
        named, instead of the step that would run it. Accepts everything by default."""

    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        """Per item: the output of its own rows (see `GenerationItem`)."""
        raise NotImplementedError


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
    cls = registry.generation_model_class(archs)
    if cls is None:
        raise ValueError(
            f"architectures: {archs or 'none given'} is not a generation model; "
            f"supported: {', '.join(registry.generation_architectures())}"
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


def _load_part(
    path: Path, config: dict[str, Any], part: str, dtype: torch.dtype
) -> GenerationModel:
    model_type = config.get("model_type")
    cls = registry.generation_part_class(model_type, part)
    if cls is None:
        raise ValueError(f"model_part: {model_type!r} checkpoints have no generation part {part!r}")
    hf_config = registry.auto_config(path)
    return cls.from_checkpoint(path, hf_config, dtype)
