"""The talker's latent heads as a checkpoint holds them: the flow-matching head's DiT
(`flowloss.cfm.model.*`) and the aggregator (`linear_proj_audio.*`), with their settings
(`flowmodel`, `aggregator`, `latent_dim`, `patch_size`, `history_patch_size`) — the
reference's names (inclusionAI/Ming-omni-tts `modeling_bailingmm.py`; vLLM-Omni's
Ming-flash-omni-2.0 talker config names the same settings).

The talker stage (`talker.py`) builds them from its config (`talker_config.heads`);
`make_tiny_heads` writes a tiny seeded pair for the heads' own tests and fixture.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnistage.families.ming_flash_omni.dit import Aggregator, DiT

DIT_PREFIX = "flowloss.cfm.model."
AGGREGATOR_PREFIX = "linear_proj_audio."
SETTINGS = "heads.json"
WEIGHTS = "heads.safetensors"
_BLOCK_KEYS = ("hidden_size", "depth", "num_heads", "mlp_ratio")


@dataclass(frozen=True)
class HeadSettings:
    """The heads' sizes, as the talker config names them."""

    latent_dim: int
    """Channels of one latent frame (the audio VAE's `latent_dim`)."""
    patch_size: int
    """Latent frames the head writes per talker step."""
    history_patch_size: int
    """Latent frames of history the DiT sees."""
    llm_hidden_size: int
    """The talker LM's hidden size (the DiT's condition, the aggregator's output)."""
    flowmodel: dict[str, Any] = field(default_factory=dict)
    """DiT sizes: hidden_size, depth, num_heads, mlp_ratio."""
    aggregator: dict[str, Any] = field(default_factory=dict)
    """Aggregator sizes: hidden_size, depth, num_heads, mlp_ratio."""

    def __post_init__(self) -> None:
        for name in ("latent_dim", "patch_size", "history_patch_size", "llm_hidden_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"talker_config.{name}: {getattr(self, name)} must be >= 1")
        for part in ("flowmodel", "aggregator"):
            sizes = getattr(self, part)
            if sizes.get("hidden_size", 1) % sizes.get("num_heads", 1):
                raise ValueError(f"talker_config.{part}.hidden_size: not a multiple of num_heads")

    def build(self, dtype: torch.dtype) -> tuple[DiT, Aggregator]:
        def sizes(part: dict[str, Any]) -> dict[str, Any]:
            return {k: part[k] for k in _BLOCK_KEYS if k in part}

        dit = DiT(self.latent_dim, self.llm_hidden_size, **sizes(self.flowmodel))
        agg = Aggregator(self.latent_dim, self.llm_hidden_size, **sizes(self.aggregator))
        return dit.to(dtype).eval(), agg.to(dtype).eval()


def load_heads(folder: Path, dtype: torch.dtype) -> tuple[HeadSettings, DiT, Aggregator]:
    """The heads of `folder` (`heads.json`, `heads.safetensors`); every weight must match."""
    from safetensors.torch import load_file

    settings = HeadSettings(**json.loads((Path(folder) / SETTINGS).read_text()))
    dit, agg = settings.build(dtype)
    weights = load_file(Path(folder) / WEIGHTS)
    for module, prefix in ((dit, DIT_PREFIX), (agg, AGGREGATOR_PREFIX)):
        part = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
        part.pop("rotary_embed.inv_freq", None)  # recomputed (x-transformers' buffer)
        module.load_state_dict({k: v.to(dtype) for k, v in part.items()}, strict=True)
    return settings, dit, agg


TINY = HeadSettings(
    latent_dim=8,
    patch_size=4,
    history_patch_size=8,
    llm_hidden_size=24,
    flowmodel={"hidden_size": 32, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0},
    aggregator={"hidden_size": 32, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0},
)


def make_tiny_heads(folder: Path, seed: int = 0) -> Path:
    """Write seeded tiny heads (N(0, 0.2) matrices, N(1, 0.1) norms, N(0, 0.1) vectors)."""
    from dataclasses import asdict

    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dit, agg = TINY.build(torch.float32)
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for module, prefix in ((dit, DIT_PREFIX), (agg, AGGREGATOR_PREFIX)):
        for name, p in module.state_dict().items():
            if "norm" in name.rsplit(".", 2)[-2]:
                value = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
            else:
                value = (0.2 if p.ndim >= 2 else 0.1) * torch.randn(p.shape, generator=g)
            out[prefix + name] = value.contiguous()
        head_dim = module.blocks[0].attn.to_q.out_features // module.heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        out[prefix + "rotary_embed.inv_freq"] = inv_freq
    save_file(out, folder / WEIGHTS)
    (folder / SETTINGS).write_text(json.dumps(asdict(TINY), indent=2))
    return folder
