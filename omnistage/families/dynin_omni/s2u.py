"""EMOVA's speech-to-unit tokenizer (S2U: `SPIRAL_L2_BN_FSQ_CTC` of EMOVA_speech_tokenizer,
the `VQCTCFinetuneModel` whose `encoder`, `pre_quant` and `quantizer` EMOVA's
`extract_unit_construct_wav_unit_text.extract_feature` runs), inference only:

    16 kHz waveform -> log-mel features (s2u_features.py, 100 frames a second)
      -> SPIRAL2 feature encoder (s2u_encoder.py; two stride-2 convolutions: 40 ms a frame)
      -> `pre_quant` Linear(D, 4) -> FSQ with levels [8, 8, 8, 8] -> one unit a frame,
         id = sum(level index_i * prod(levels[:i])) in [0, 4096).

FSQ as `my_scripts/fsq.py` computes it (float32 buffers, the reference's `tan` shift for
even levels kept as written): bound `tanh(z + tan(0.5 / h)) * h - 0.5` with
`h = (L - 1) * (1 - 1e-3) / 2`, round, divide by `L // 2`, then back to `0..L-1` and the
mixed-radix index. The CTC decoder (`decoder.*`) is training-only and not loaded.

Checkpoint layout read here: a folder with `hparams.yaml` (the Lightning run's
hyper-parameters, as EMOVA ships it in `my_S2U_model/.../hparams.yaml`: `encoder.preprocessor`,
`encoder.feature_encoder`, `quantizer.levels`) and `model.safetensors` holding the
checkpoint's `state_dict` under its own names (`encoder.feature_encoder.*`, `pre_quant.*`;
other keys are ignored). EMOVA's `.ckpt` converts by saving its `state_dict` so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import load_file
from torch import nn

from omnistage.families.dynin_omni.s2u_encoder import (
    ConvSpec,
    FeatureEncoder,
    TransformerSpec,
)
from omnistage.families.dynin_omni.s2u_features import S2UFeatureConfig, S2UFeatures

S2U_DIR = "s2u"
ENCODER_PREFIX = "encoder.feature_encoder."
FSQ_EPS = 1e-3
_FIXED = {
    "normalize": "per_feature",
    "normalize_time_domain": True,
    "stft_conv": False,
    "stft_exact_pad": False,
    "log": True,
    "log_zero_guard_type": "add",
    "mag_power": 2.0,
    "frame_splicing": 1,
    "window": "hann",
    "dither_train_only": True,
}
"""Preprocessor settings this port implements (EMOVA's); any other value is refused."""


@dataclass(frozen=True)
class S2UConfig:
    features: S2UFeatureConfig
    """The log-mel front end."""
    blocks: tuple[tuple[tuple[ConvSpec, ...], TransformerSpec], ...]
    """The feature encoder's convolution + transformer blocks."""
    levels: tuple[int, ...]
    """FSQ levels (EMOVA: 8, 8, 8, 8 -> 4096 units)."""

    @property
    def codebook_size(self) -> int:
        return math.prod(self.levels)

    @classmethod
    def from_hparams(cls, raw: dict[str, Any]) -> S2UConfig:
        try:
            pre = raw["encoder"]["preprocessor"]
            enc = raw["encoder"]["feature_encoder"]
            levels = tuple(int(v) for v in raw["quantizer"]["levels"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"hparams.yaml: missing {e}") from None
        for key, want in _FIXED.items():
            if pre.get(key, want) != want:
                raise ValueError(f"encoder.preprocessor.{key}: only {want!r} is supported")
        if pre.get("n_fft") is not None or pre.get("lowfreq", 0) or pre.get("highfreq"):
            raise ValueError("encoder.preprocessor: n_fft/lowfreq/highfreq must be the defaults")
        if abs(float(pre.get("log_zero_guard_value", 2.0**-24)) - 2.0**-24) > 1e-12:
            raise ValueError("encoder.preprocessor.log_zero_guard_value: only 2**-24")
        if enc.get("conv2d_block") or not enc.get("use_tf_pad") or not enc.get("use_conv_mask"):
            raise ValueError("encoder.feature_encoder: needs use_tf_pad, use_conv_mask, no conv2d")
        features = S2UFeatureConfig(
            sample_rate=int(pre["sample_rate"]),
            window_size=float(pre["window_size"]),
            window_stride=float(pre["window_stride"]),
            features=int(pre["features"]),
            preemph=float(pre["preemph"]),
            pad_to=int(pre["pad_to"]),
        )
        blocks = tuple(_block(b, i) for i, b in enumerate(enc["conv_transformer_blocks"]))
        if int(enc["feat_in"]) != features.features:
            raise ValueError("encoder.feature_encoder.feat_in: must equal preprocessor.features")
        return cls(features=features, blocks=blocks, levels=levels)


def _block(raw: dict[str, Any], index: int) -> tuple[tuple[ConvSpec, ...], TransformerSpec]:
    where = f"encoder.feature_encoder.conv_transformer_blocks[{index}]"
    convs = []
    for j, c in enumerate(raw["conv_layers"]):
        if c.get("norm_type") != "ln" or c.get("act_func") not in ("relu", None):
            raise ValueError(f"{where}.conv_layers[{j}]: only ln norm and relu/none")
        if c.get("residual") or list(c.get("dilation", [1])) != [1] or c.get("bias") is False:
            raise ValueError(f"{where}.conv_layers[{j}]: no residual/dilation, with bias")
        convs.append(
            ConvSpec(
                filters=int(c["filters"]),
                kernel_size=int(c["kernel_size"][0]),
                stride=int(c["stride"][0]),
                relu=c["act_func"] == "relu",
            )
        )
    t = raw["transformer_block"]
    e = t["encoder"]
    if t.get("use_pytorch_transformer") or not e.get("layer_norm_first"):
        raise ValueError(f"{where}.transformer_block: only the pre-LN fairseq transformer")
    if str(e.get("activation_fn")) != "gelu":
        raise ValueError(f"{where}.transformer_block.encoder.activation_fn: only gelu")
    spec = TransformerSpec(
        layers=int(e["encoder_layers"]),
        dim=int(e["embedding_dim"]),
        ffn_dim=int(e["ffn_embedding_dim"]),
        heads=int(e["num_attention_heads"]),
        conv_pos=int(t["conv"]["conv_pos"]),
        conv_pos_groups=int(t["conv"]["conv_pos_groups"]),
    )
    return tuple(convs), spec


class FSQ(nn.Module):
    """Finite scalar quantization to unit ids (no parameters)."""

    def __init__(self, levels: tuple[int, ...]) -> None:
        super().__init__()
        lv = torch.tensor(levels, dtype=torch.float32)
        self.register_buffer("levels", lv, persistent=False)
        basis = torch.cat((torch.ones(1), torch.cumprod(lv[:-1], dim=0)))
        self.register_buffer("basis", basis, persistent=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        half_l = (self.levels - 1) * (1 - FSQ_EPS) / 2
        offset = torch.where(self.levels % 2 == 1, 0.0, 0.5)
        shift = torch.tan(offset / half_l)
        bounded = torch.tanh(z + shift) * half_l - offset
        half_width = torch.div(self.levels, 2, rounding_mode="floor")
        zhat = torch.round(bounded) / half_width
        index = (zhat * half_width + half_width) * self.basis
        return torch.sum(index, dim=-1).to(torch.long)


class SpeechToUnit(nn.Module):
    """A 16 kHz waveform -> its unit ids (one per 40 ms frame at EMOVA's sizes)."""

    def __init__(self, config: S2UConfig) -> None:
        super().__init__()
        self.config = config
        self.frontend = S2UFeatures(config.features)
        blocks = [(list(convs), t) for convs, t in config.blocks]
        self.feature_encoder = FeatureEncoder(config.features.features, blocks)
        self.pre_quant = nn.Linear(self.feature_encoder.output_dim, len(config.levels))
        self.quantizer = FSQ(config.levels)

    @torch.no_grad()
    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        """wav: [n] float at `features.sample_rate` -> units [frames] (long)."""
        dtype = self.pre_quant.weight.dtype
        feats, length = self.frontend(wav.to(dtype))
        lengths = torch.tensor([length])
        encoded, enc_len = self.feature_encoder(feats.unsqueeze(0), lengths)
        units = self.quantizer(self.pre_quant(encoded))
        return units[0, : int(enc_len[0])]

    @classmethod
    def load(cls, folder: Path, dtype: torch.dtype = torch.float32) -> SpeechToUnit:
        folder = Path(folder)
        raw = yaml.safe_load((folder / "hparams.yaml").read_text())
        model = cls(S2UConfig.from_hparams(raw))
        state = load_file(str(folder / "model.safetensors"))
        model.load_checkpoint_state(state)
        return model.to(dtype).eval().requires_grad_(False)

    def load_checkpoint_state(self, state: dict[str, torch.Tensor]) -> None:
        """Take the checkpoint's `encoder.feature_encoder.*` and `pre_quant.*` (weight norm
        of the positional convolutions fused: `weight = g * v / |v|` over dims 0, 1)."""
        ours: dict[str, torch.Tensor] = {}
        for name, value in state.items():
            if name.startswith(ENCODER_PREFIX):
                ours["feature_encoder." + name[len(ENCODER_PREFIX) :]] = value
            elif name.startswith("pre_quant."):
                ours[name] = value
        for name in [n for n in ours if n.endswith(".weight_g")]:
            stem = name[: -len("_g")]
            g, v = ours.pop(name), ours.pop(stem + "_v")
            ours[stem] = torch._weight_norm(v, g, 2)
        missing, unexpected = self.load_state_dict(ours, strict=False)
        if missing or unexpected:
            raise ValueError(f"s2u checkpoint: missing {missing[:4]}, unexpected {unexpected[:4]}")
