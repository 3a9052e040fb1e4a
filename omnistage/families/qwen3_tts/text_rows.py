"""The talker's text side: token ids -> projected rows, read lazily from the checkpoint.

Qwen3-TTS feeds its talker text as `text_projection(text_embedding(ids))`: the
embedding is the full Qwen vocabulary at the text model's width (151936 x 2048,
1.2 GB in float32), of which a request uses a few dozen rows, so the table stays
in the safetensors file and only the rows asked for are read; the projection (a
two-layer SiLU MLP with biases) and the codec embeddings (code 0's and the code
predictor's, to embed a cloned voice's reference frames) are small and loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.layers.linear import Embedding, Linear

TEXT_EMBEDDING = "talker.model.text_embedding.weight"
_PROJECTION = "talker.text_projection."
_CODEC_EMBEDDING = "talker.model.codec_embedding.weight"
_PREDICTOR_EMBEDDING = "talker.code_predictor.model.codec_embedding."


class TextProjection(nn.Module):
    """`Qwen3TTSTalkerResizeMLP`: text width -> text width -> talker width, SiLU."""

    def __init__(self, text_hidden: int, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.linear_fc1 = Linear(text_hidden, text_hidden, True, dtype=dtype)
        self.linear_fc2 = Linear(text_hidden, hidden, True, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerTextSide(nn.Module):
    """Projected text rows and codec embeddings for building talker prompts."""

    def __init__(self, path: Path, talker: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        hidden = talker.hidden_size
        self.text_projection = TextProjection(talker.text_hidden_size, hidden, dtype)
        self.codec_embedding = Embedding(talker.vocab_size, hidden, dtype=dtype)
        predictor = talker.code_predictor_config
        self.predictor_embedding = nn.ModuleList(
            Embedding(predictor.vocab_size, hidden, dtype=dtype)
            for _ in range(talker.num_code_groups - 1)
        )
        """Codes 1..G-1 (the code predictor's tables): a whole frame's embedding."""
        self.requires_grad_(False)
        self._file, self._table = self._load(Path(path))

    def _load(self, path: Path) -> tuple[Path, tuple[int, int]]:
        import safetensors

        from omnistage.models.loader import safetensors_files

        state = self.state_dict()
        found, table_file, shape = set(), None, None
        for file in safetensors_files(path):
            with safetensors.safe_open(file, framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
                    ours = _ours(key)
                    if key == TEXT_EMBEDDING:
                        table_file, shape = file, tuple(f.get_slice(key).get_shape())
                    elif ours is not None:
                        tensor = f.get_tensor(key)
                        if ours not in state or state[ours].shape != tensor.shape:
                            raise ValueError(f"{file}: tensor {key} does not fit the talker")
                        state[ours].copy_(tensor.to(self.dtype))
                        found.add(ours)
        missing = sorted(set(state) - found)
        if missing or table_file is None:
            raise ValueError(f"{path}: the talker's text side is incomplete (missing {missing})")
        return table_file, shape  # type: ignore[return-value]

    @torch.inference_mode()
    def text(self, ids: list[int]) -> torch.Tensor:
        """[len(ids), hidden]: the projected text embedding of each id."""
        import safetensors

        if not ids:
            return torch.zeros(0, self.codec_embedding.embedding_dim, dtype=self.dtype)
        vocab = self._table[0]
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise ValueError(f"input: token id {bad[0]} is outside the text vocabulary ({vocab})")
        unique = sorted(set(ids))
        with safetensors.safe_open(self._file, framework="pt") as f:
            table = f.get_slice(TEXT_EMBEDDING)
            rows = torch.cat([table[i : i + 1] for i in unique]).to(self.dtype)
        where = {token: n for n, token in enumerate(unique)}
        return self.text_projection(rows[[where[i] for i in ids]])

    @torch.inference_mode()
    def codec(self, ids: list[int]) -> torch.Tensor:
        """[len(ids), hidden]: the codec embedding of each id."""
        return self.codec_embedding(torch.tensor(ids, dtype=torch.long))

    @torch.inference_mode()
    def frames(self, codes: torch.Tensor) -> torch.Tensor:
        """[frames, G] codes -> [frames, hidden]: each frame's codes' embeddings summed, as
        the talker embeds a frame it wrote."""
        out = self.codec_embedding(codes[:, 0])
        for j, table in enumerate(self.predictor_embedding):
            out = out + table(codes[:, j + 1])
        return out


def _ours(key: str) -> str | None:
    if key.startswith(_PROJECTION):
        return "text_projection." + key[len(_PROJECTION) :]
    if key.startswith(_PREDICTOR_EMBEDDING):
        return "predictor_embedding." + key[len(_PREDICTOR_EMBEDDING) :]
    if key == _CODEC_EMBEDDING:
        return "codec_embedding.weight"
    return None
