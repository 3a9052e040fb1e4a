"""Bagel's checkpoint layout and the settings read from it.

A Bagel checkpoint (ByteDance-Seed/BAGEL-7B-MoT) is a folder, not one HF config:

- `llm_config.json`: the Qwen2 language model (the two experts share it);
- `vit_config.json`: the SigLIP vision encoder (image input);
- `ema.safetensors`: every weight, named as Bagel's `Bagel` module names them
  (`language_model.model.layers.N.self_attn.q_proj_moe_gen.weight`, `vae2llm.weight`, …);
- `ae.safetensors`: the FLUX autoencoder, in FLUX's own names;
- the Qwen2 tokenizer files.

The reference hard-codes the rest (its `app.py` and `load_ae`): latent patch 2, 64
latent patches a side, FLUX's autoencoder sizes. Those are the defaults here; an
optional `bagel_config.json` (fields of `BagelConfig` below, as Bagel's `BagelConfig`
names them) and `ae_config.json` (fields of Bagel's `AutoEncoderParams`) override them,
which is how a tiny test checkpoint states its own sizes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

LLM_CONFIG = "llm_config.json"
VIT_CONFIG = "vit_config.json"
WEIGHTS = "ema.safetensors"
AE_WEIGHTS = "ae.safetensors"
BAGEL_CONFIG = "bagel_config.json"
AE_CONFIG = "ae_config.json"

SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>")
"""Bagel's `add_special_tokens`: bos, eos, start of image, end of image."""


@dataclass(frozen=True)
class AutoEncoderParams:
    """The FLUX autoencoder's sizes, in the names of Bagel's `modeling/autoencoder.py`."""

    resolution: int = 256
    in_channels: int = 3
    downsample: int = 8
    """Pixels per latent in each direction (2 ** (len(ch_mult) - 1))."""
    ch: int = 128
    out_ch: int = 3
    ch_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    z_channels: int = 16
    scale_factor: float = 0.3611
    shift_factor: float = 0.1159

    def __post_init__(self) -> None:
        if self.downsample != 2 ** (len(self.ch_mult) - 1):
            raise ValueError(
                f"downsample: {self.downsample} does not match ch_mult {list(self.ch_mult)} "
                f"(expected {2 ** (len(self.ch_mult) - 1)})"
            )
        if self.ch % 32:
            raise ValueError(f"ch: {self.ch} is not a multiple of 32 (the group norms' groups)")


@dataclass(frozen=True)
class BagelConfig:
    """What the text-to-image path needs besides the language model's own config."""

    llm: Any
    """The transformers `Qwen2Config` of `llm_config.json`."""
    vae: AutoEncoderParams
    latent_patch_size: int = 2
    """Latent pixels per side of one generation token."""
    max_latent_size: int = 64
    """Generation tokens per side of the position-embedding grid (largest image side /
    (vae downsample x patch))."""
    vit_max_num_patch_per_side: int = 70
    connector_act: str = "gelu_pytorch_tanh"
    timestep_shift: float = 3.0
    """The flow schedule's shift (the inferencer's default)."""
    vae_image_sizes: tuple[int, int] = (1024, 512)
    """Longest and shortest side of an input image's VAE view (`app.py`'s
    `ImageTransform(1024, 512, 16)`; the stride is `latent_downsample`)."""
    vit_image_sizes: tuple[int, int] = (980, 224)
    """The same for its ViT view (`ImageTransform(980, 224, 14)`; the stride is the ViT
    patch)."""

    def __post_init__(self) -> None:
        for name in ("latent_patch_size", "max_latent_size", "vit_max_num_patch_per_side"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        for name in ("vae_image_sizes", "vit_image_sizes"):
            value = getattr(self, name)
            if len(value) != 2 or not 1 <= value[1] <= value[0]:
                raise ValueError(f"{name}: expected [longest, shortest] sides, got {value!r}")

    @property
    def hidden_size(self) -> int:
        return self.llm.hidden_size

    @property
    def latent_downsample(self) -> int:
        """Pixels per generation token in each direction."""
        return self.vae.downsample * self.latent_patch_size

    @property
    def patch_latent_dim(self) -> int:
        """Floats per generation token: a patch of latent pixels, all channels."""
        return self.latent_patch_size**2 * self.vae.z_channels

    @classmethod
    def load(cls, path: str | Path) -> BagelConfig:
        """The config of the checkpoint folder `path`."""
        from transformers import Qwen2Config

        path = Path(path)
        if not (path / LLM_CONFIG).is_file():
            raise ValueError(f"{path}: not a Bagel checkpoint (no {LLM_CONFIG})")
        llm = Qwen2Config.from_json_file(str(path / LLM_CONFIG))
        ae = _known(AutoEncoderParams, _read(path / AE_CONFIG))
        if "ch_mult" in ae:
            ae["ch_mult"] = tuple(ae["ch_mult"])
        vae = AutoEncoderParams(**ae)
        own = _known(cls, _read(path / BAGEL_CONFIG))
        own.pop("llm", None)
        own.pop("vae", None)
        for name in ("vae_image_sizes", "vit_image_sizes"):
            if name in own:
                own[name] = tuple(own[name])
        return cls(llm=llm, vae=vae, **own)

    def load_vit(self, path: str | Path) -> Any:
        """The transformers `SiglipVisionConfig` of `vit_config.json` in folder `path`."""
        from transformers import SiglipVisionConfig

        file = Path(path) / VIT_CONFIG
        if not file.is_file():
            raise ValueError(f"{path}: no {VIT_CONFIG} (image input needs the vision encoder)")
        return SiglipVisionConfig.from_json_file(str(file))


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _known(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The entries of `values` that are fields of `cls` (a file may hold more)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in values.items() if k in names}
