"""The tiny Ming-Omni vocoder files: `talker/audio_detokenizer.yaml`, `talker/flow.pt`,
`talker/hift.pt`, with seeded random weights under the reference's names.

The yaml has the reference's layout (hyperpyyaml `!new:` nodes for `flow` and `hift`, the
CosyVoice-1 architecture) at tiny sizes; `hift.pt` stores the weight-normed convolutions
as `weight_g` / `weight_v` pairs, as a state dict of the reference's `HiFTGenerator` does.
"""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.families.ming_omni.flow import MingFlow
from omnistage.families.ming_omni.hift import MingHiFT
from omnistage.families.ming_omni.vocoder_config import load_detokenizer_config

SPEECH_VOCAB = 48
"""Speech tokens (S3 codes) of the tiny flow."""
BPE_MERGES = 16
"""The tiny speech BPE: one token per S3 code, then merges of codes (i, i + 1)."""
SPK_EMBED_DIM = 192
"""The x-vector size: the speaker embedding the talker also reads (`talker/spks/*.pt`)."""

TINY_YAML = f"""\
flow: !new:audio_detokenizer.flow.flow.MaskedDiffWithXvec
    input_size: 16
    output_size: 8
    spk_embed_dim: {SPK_EMBED_DIM}
    output_type: 'mel'
    vocab_size: {SPEECH_VOCAB}
    input_frame_rate: 50
    only_mask_loss: True
    encoder: !new:audio_detokenizer.transformer.encoder.ConformerEncoder
        output_size: 16
        attention_heads: 2
        linear_units: 32
        num_blocks: 2
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: 16
        use_cnn_module: False
        macaron_style: False
    length_regulator: !new:audio_detokenizer.flow.length_regulator.InterpolateRegulator
        channels: 8
        sampling_ratios: [1, 1]
    decoder: !new:audio_detokenizer.flow.flow_matching.ConditionalCFM
        in_channels: 16
        n_spks: 1
        spk_emb_dim: 8
        cfm_params: {{sigma_min: 1.0e-06, solver: 'euler', t_scheduler: 'cosine',
                      training_cfg_rate: 0.2, inference_cfg_rate: 0.7, reg_loss_type: 'l1'}}
        estimator: !new:audio_detokenizer.flow.decoder.ConditionalDecoder
            in_channels: 32
            out_channels: 8
            channels: [16, 16]
            dropout: 0.0
            attention_head_dim: 8
            n_blocks: 1
            num_mid_blocks: 1
            num_heads: 2
            act_fn: 'gelu'
hift: !new:audio_detokenizer.hifigan.generator.HiFTGenerator
    in_channels: 8
    base_channels: 16
    nb_harmonics: 2
    sampling_rate: 22050
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 8]
    upsample_kernel_sizes: [16, 16]
    istft_params: {{n_fft: 16, hop_len: 4}}
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    f0_predictor: !new:audio_detokenizer.hifigan.f0_predictor.ConvRNNF0Predictor
        num_class: 1
        in_channels: 8
        cond_channels: 8
"""


def _weight_normed(name: str) -> bool:
    """Whether the reference wraps this hift weight in `weight_norm`."""
    if not name.endswith(".weight"):
        return False
    plain = ("source_downs.", "m_source.", "f0_predictor.classifier.", "activations")
    return not any(part in name for part in plain)


def _split_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if _weight_normed(name) and value.dim() == 3:
            stem = name[: -len("weight")]
            out[stem + "weight_g"] = value.norm(dim=(1, 2), keepdim=True)
            out[stem + "weight_v"] = value.clone()
        else:
            out[name] = value
    return out


def _perturb(module: torch.nn.Module, g: torch.Generator, scale: float) -> dict[str, torch.Tensor]:
    """A state dict of `module`'s default init plus seeded noise (so that biases, norms,
    Snake alphas and attention biases are not their trivial initial values)."""
    return {
        n: p.detach() + scale * torch.randn(p.shape, generator=g)
        for n, p in module.state_dict().items()
    }


def _code_char(code: int) -> str:
    return chr(0x4E00 + code)  # CJK ideographs, as the real mapping uses


def write_tiny_bpe(talker_dir: Path) -> None:
    """`s3_bpe/tokenizer.json` (a BPE of `SPEECH_VOCAB + BPE_MERGES` tokens) and
    `s3_bpe/char_mapping.txt`."""
    from tokenizers import Tokenizer, models

    from omnistage.families.ming_omni.s3bpe import BPE_DIR

    folder = talker_dir / BPE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {_code_char(i): i for i in range(SPEECH_VOCAB)}
    merges = [(_code_char(i), _code_char(i + 1)) for i in range(BPE_MERGES)]
    for i, (a, b) in enumerate(merges):
        vocab[a + b] = SPEECH_VOCAB + i
    Tokenizer(models.BPE(vocab=vocab, merges=merges)).save(str(folder / "tokenizer.json"))
    lines = [f"{i}\t{_code_char(i)}" for i in range(SPEECH_VOCAB)]
    (folder / "char_mapping.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_tiny_vocoder(talker_dir: Path, seed: int) -> None:
    """Write the vocoder files into `talker_dir` (the checkpoint's `talker/`): the yaml,
    `flow.pt`, `hift.pt` and the speech BPE (`write_tiny_bpe`)."""
    write_tiny_bpe(talker_dir)
    (talker_dir / "audio_detokenizer.yaml").write_text(TINY_YAML, encoding="utf-8")
    flow_cfg, hift_cfg = load_detokenizer_config(talker_dir)
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # the default inits draw from the global RNG
        torch.manual_seed(seed)
        flow = _perturb(MingFlow(flow_cfg), g, 0.05)
        hift = _perturb(MingHiFT(hift_cfg), g, 0.05)
    torch.save(flow, talker_dir / "flow.pt")
    torch.save(_split_weight_norm(hift), talker_dir / "hift.pt")
