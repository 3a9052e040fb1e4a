"""The configuration of Ming-Omni's audio detokenizer (`talker/audio_detokenizer.yaml`).

The reference reads that file with hyperpyyaml (`!new:` tags build its modules); here it
is read as plain YAML, each tagged node taken as the mapping of its constructor's keyword
arguments, and only the fields the inference path uses are kept. The architecture is
CosyVoice-1's (`MaskedDiffWithXvec`: a Conformer encoder, an interpolating length
regulator, a conditional U-Net flow estimator; `HiFTGenerator` with a conv F0 predictor);
options outside that path (a CNN module, macaron feed-forwards, another positional
encoding) are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DETOKENIZER_YAML = "audio_detokenizer.yaml"


class _TagTolerantLoader(yaml.SafeLoader):
    """SafeLoader that reads any `!tag` node as its plain mapping / sequence / scalar."""


def _untagged(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_TagTolerantLoader.add_multi_constructor("!", _untagged)


@dataclass(frozen=True)
class MingFlowConfig:
    """`flow:` (MaskedDiffWithXvec) with its encoder, length regulator and decoder."""

    input_size: int
    output_size: int
    encoder_output_size: int
    spk_embed_dim: int
    vocab_size: int
    input_frame_rate: int
    encoder_heads: int
    encoder_linear_units: int
    encoder_blocks: int
    regulator_ratios: int
    estimator_in_channels: int
    channels: tuple[int, ...]
    attention_head_dim: int
    n_blocks: int
    num_mid_blocks: int
    num_heads: int
    inference_cfg_rate: float
    t_scheduler: str
    n_timesteps: int = 8


@dataclass(frozen=True)
class MingHiFTConfig:
    """`hift:` (HiFTGenerator, ConvRNNF0Predictor)."""

    in_channels: int
    base_channels: int
    nb_harmonics: int
    sampling_rate: int
    nsf_alpha: float
    nsf_sigma: float
    nsf_voiced_threshold: float
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    n_fft: int
    hop_len: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    source_resblock_kernel_sizes: tuple[int, ...]
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    lrelu_slope: float
    audio_limit: float
    f0_cond_channels: int

    @property
    def samples_per_frame(self) -> int:
        """Waveform samples per mel frame (the F0 upsampling factor)."""
        factor = self.hop_len
        for rate in self.upsample_rates:
            factor *= rate
        return factor


def _require(section: dict[str, Any], key: str, where: str) -> Any:
    if key not in section:
        raise ValueError(f"{DETOKENIZER_YAML}: {where}.{key} is missing")
    return section[key]


def _check_encoder(enc: dict[str, Any]) -> None:
    wanted = {
        "input_layer": "linear",
        "pos_enc_layer_type": "rel_pos_espnet",
        "selfattention_layer_type": "rel_selfattn",
        "use_cnn_module": False,
        "macaron_style": False,
        "normalize_before": True,
    }
    for key, value in wanted.items():
        if enc.get(key, value) != value:
            raise ValueError(
                f"{DETOKENIZER_YAML}: flow.encoder.{key}={enc[key]!r} is not supported"
            )
    if enc.get("activation_type", "swish") != "swish":
        raise ValueError(f"{DETOKENIZER_YAML}: flow.encoder.activation_type must be swish")


def flow_config(flow: dict[str, Any]) -> MingFlowConfig:
    """`MingFlowConfig` from the yaml's `flow:` node."""
    enc = _require(flow, "encoder", "flow")
    _check_encoder(enc)
    reg = _require(flow, "length_regulator", "flow")
    dec = _require(flow, "decoder", "flow")
    est = _require(dec, "estimator", "flow.decoder")
    cfm = _require(dec, "cfm_params", "flow.decoder")
    if est.get("act_fn", "gelu") != "gelu":
        raise ValueError(f"{DETOKENIZER_YAML}: flow.decoder.estimator.act_fn must be gelu")
    if cfm.get("solver", "euler") != "euler":
        raise ValueError(f"{DETOKENIZER_YAML}: flow.decoder.cfm_params.solver must be euler")
    return MingFlowConfig(
        input_size=int(_require(flow, "input_size", "flow")),
        output_size=int(_require(flow, "output_size", "flow")),
        encoder_output_size=int(_require(enc, "output_size", "flow.encoder")),
        spk_embed_dim=int(_require(flow, "spk_embed_dim", "flow")),
        vocab_size=int(_require(flow, "vocab_size", "flow")),
        input_frame_rate=int(_require(flow, "input_frame_rate", "flow")),
        encoder_heads=int(_require(enc, "attention_heads", "flow.encoder")),
        encoder_linear_units=int(_require(enc, "linear_units", "flow.encoder")),
        encoder_blocks=int(_require(enc, "num_blocks", "flow.encoder")),
        regulator_ratios=len(_require(reg, "sampling_ratios", "flow.length_regulator")),
        estimator_in_channels=int(_require(est, "in_channels", "flow.decoder.estimator")),
        channels=tuple(int(c) for c in est.get("channels", (256, 256))),
        attention_head_dim=int(est.get("attention_head_dim", 64)),
        n_blocks=int(est.get("n_blocks", 1)),
        num_mid_blocks=int(est.get("num_mid_blocks", 2)),
        num_heads=int(est.get("num_heads", 4)),
        inference_cfg_rate=float(cfm.get("inference_cfg_rate", 0.7)),
        t_scheduler=str(cfm.get("t_scheduler", "cosine")),
    )


def hift_config(hift: dict[str, Any]) -> MingHiFTConfig:
    """`MingHiFTConfig` from the yaml's `hift:` node."""
    istft = _require(hift, "istft_params", "hift")
    f0 = _require(hift, "f0_predictor", "hift")
    return MingHiFTConfig(
        in_channels=int(hift.get("in_channels", 80)),
        base_channels=int(hift.get("base_channels", 512)),
        nb_harmonics=int(hift.get("nb_harmonics", 8)),
        sampling_rate=int(hift.get("sampling_rate", 22050)),
        nsf_alpha=float(hift.get("nsf_alpha", 0.1)),
        nsf_sigma=float(hift.get("nsf_sigma", 0.003)),
        nsf_voiced_threshold=float(hift.get("nsf_voiced_threshold", 10)),
        upsample_rates=tuple(int(r) for r in hift.get("upsample_rates", (8, 8))),
        upsample_kernel_sizes=tuple(int(k) for k in hift.get("upsample_kernel_sizes", (16, 16))),
        n_fft=int(istft["n_fft"]),
        hop_len=int(istft["hop_len"]),
        resblock_kernel_sizes=tuple(int(k) for k in hift.get("resblock_kernel_sizes", (3, 7, 11))),
        resblock_dilation_sizes=tuple(
            tuple(int(d) for d in ds) for ds in hift.get("resblock_dilation_sizes", [[1, 3, 5]] * 3)
        ),
        source_resblock_kernel_sizes=tuple(
            int(k) for k in hift.get("source_resblock_kernel_sizes", (7, 11))
        ),
        source_resblock_dilation_sizes=tuple(
            tuple(int(d) for d in ds)
            for ds in hift.get("source_resblock_dilation_sizes", [[1, 3, 5]] * 2)
        ),
        lrelu_slope=float(hift.get("lrelu_slope", 0.1)),
        audio_limit=float(hift.get("audio_limit", 0.99)),
        f0_cond_channels=int(_require(f0, "cond_channels", "hift.f0_predictor")),
    )


def _resolve_refs(node: Any, top: dict[str, Any]) -> Any:
    """hyperpyyaml's `!ref <name>` (read as the string "<name>"): the top-level value."""
    if isinstance(node, dict):
        return {k: _resolve_refs(v, top) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve_refs(v, top) for v in node]
    if isinstance(node, str) and node.startswith("<") and node.endswith(">") and node[1:-1] in top:
        return top[node[1:-1]]
    return node


def load_detokenizer_config(talker_dir: Path) -> tuple[MingFlowConfig, MingHiFTConfig]:
    """Both configs from `<talker_dir>/audio_detokenizer.yaml` (ValueError if absent)."""
    path = talker_dir / DETOKENIZER_YAML
    if not path.is_file():
        raise ValueError(f"model: {path} is missing (the Ming-Omni vocoder's config)")
    raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_TagTolerantLoader)  # noqa: S506
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a mapping")
    raw = _resolve_refs(raw, raw)
    return flow_config(_require(raw, "flow", "")), hift_config(_require(raw, "hift", ""))
