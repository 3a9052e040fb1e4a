"""A tiny random-weight CosyVoice3 checkpoint in the reference's own layout.

`cosyvoice3.yaml` (the real file's structure and tags, tiny sizes), `llm.pt`, `flow.pt`
and `hift.pt` with the real state-dict names, `CosyVoice-BlankEN/` (a tiny Qwen2 config
and a byte-level tokenizer), `spk2info.pt` with two zero-shot voices, and tiny
`speech_tokenizer_v3.onnx` / `campplus.onnx` for cloning uploads (`tiny_onnx.py`). Loading
it goes through the same conversion (`layout.py`) as a real checkpoint. The speech side
keeps the real sizes that fix ids and shapes: 6561 speech tokens, 80 mel bins, 192-dim
speaker embeddings, 25-token flow chunks, 480 samples per mel frame at 24 kHz.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from omnistage.families.cosyvoice3 import tiny_onnx
from omnistage.families.cosyvoice3.layout import SPECIAL_TOKENS, TEXT_MODEL

SPEECH_TOKENS = 6561
TEXT_VOCAB = 512
VOICES = {"demo": "Hello there.", "bright": "A brighter voice."}
"""The zero-shot voices: name -> the transcript of their (random) clip."""
VOICE_TOKENS = 50
"""Two flow chunks: a stream's first chunk ends 25 tokens after the prompt."""
SYSTEM = "You are a helpful assistant.<|endofprompt|>"

FLOW = dict(
    pre_lookahead_channels=32, dit_dim=64, dit_depth=2, dit_heads=2, dit_dim_head=32, dit_ff_mult=2
)
HIFT = dict(base_channels=16, f0_cond_channels=16)

_YAML = """\
# A tiny CosyVoice3 (omnistage's demo): the structure of the real cosyvoice3.yaml.
sample_rate: 24000
llm_input_size: {hidden}
llm_output_size: {hidden}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: 25
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: {speech_tokens}
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: {speech_tokens}
    input_frame_rate: !ref <token_frame_rate>
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: {pre_lookahead_channels}
        pre_lookahead_len: 3
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {dit_dim}
            depth: {dit_depth}
            heads: {dit_heads}
            dim_head: {dit_dim_head}
            ff_mult: {dit_ff_mult}
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: 80
    base_channels: {base_channels}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    conv_pre_look_right: 4
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: {f0_cond_channels}
"""


def _text_model(path: Path, seed: int) -> dict[str, torch.Tensor]:
    """`CosyVoice-BlankEN/` (config + tokenizer) and the LM's Qwen2 weights (`llm.model.`)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from omnistage.models.tiny_checkpoints import byte_tokenizer

    folder = path / TEXT_MODEL
    folder.mkdir(parents=True, exist_ok=True)
    config = Qwen2Config(
        vocab_size=TEXT_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
    )  # fmt: skip
    config.architectures = ["Qwen2ForCausalLM"]
    config.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    # The class any transformers release reads (the reference pins 4.51).
    settings_file = folder / "tokenizer_config.json"
    settings = json.loads(settings_file.read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    settings_file.write_text(json.dumps(settings, indent=2))
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            state[f"llm.model.{name}"] = torch.ones(shape)
        else:
            state[f"llm.model.{name}"] = torch.randn(shape, generator=generator) * 0.2
    # Tied, as in the real file: the text head is the text embedding.
    state["llm.model.lm_head.weight"] = state["llm.model.model.embed_tokens.weight"]
    return state


def _randomized(module: torch.nn.Module, seed: int, std: float) -> dict[str, torch.Tensor]:
    """The module's state dict with its parameters drawn from N(0, std) (buffers, such as
    the DiT's rotary frequencies, kept)."""
    generator = torch.Generator().manual_seed(seed)
    parameters = dict(module.named_parameters())
    state = {}
    for name, tensor in module.state_dict().items():
        if name in parameters:
            noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
            state[name] = (noise * std).to(tensor.dtype)
        else:
            state[name] = tensor.clone()
    return state


_WEIGHT_NORMED = re.compile(
    r"(conv_pre|conv_post|ups\.\d+|f0_predictor\.condnet\.\d+|"
    r"(source_)?resblocks\.\d+\.convs[12]\.\d+)\.weight"
)
"""The vocoder's weight-normed convolutions (saved as their norm and direction)."""


def _weight_normed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our vocoder's plain weights as the reference's `hift.pt` holds them:
    `generator.`-prefixed, weight-normed convolutions as `weight_g` / `weight_v`."""
    out = {}
    for name, tensor in state.items():
        if _WEIGHT_NORMED.fullmatch(name):
            stem = name[: -len("weight")]
            out[f"generator.{stem}weight_g"] = tensor.norm(dim=(1, 2), keepdim=True)
            out[f"generator.{stem}weight_v"] = tensor
        else:
            out[f"generator.{name}"] = tensor
    return out


def _voice(path: Path, seed: int, transcript: str) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path / TEXT_MODEL)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    ids = tokenizer([SYSTEM + transcript])["input_ids"][0]
    generator = torch.Generator().manual_seed(seed + 3)
    tokens = torch.randint(
        0, SPEECH_TOKENS, (1, VOICE_TOKENS), generator=generator, dtype=torch.int32
    )
    feat = torch.randn(1, 2 * VOICE_TOKENS, 80, generator=generator) - 5
    embedding = torch.randn(1, 192, generator=generator)
    return {
        "prompt_text": torch.tensor([ids], dtype=torch.int32),
        "prompt_text_len": torch.tensor([len(ids)], dtype=torch.int32),
        "llm_prompt_speech_token": tokens,
        "llm_prompt_speech_token_len": torch.tensor([VOICE_TOKENS], dtype=torch.int32),
        "flow_prompt_speech_token": tokens,
        "flow_prompt_speech_token_len": torch.tensor([VOICE_TOKENS], dtype=torch.int32),
        "prompt_speech_feat": feat,
        "prompt_speech_feat_len": torch.tensor([2 * VOICE_TOKENS], dtype=torch.int32),
        "llm_embedding": embedding,
        "flow_embedding": embedding,
    }


def make_tiny_cosyvoice3(path: str | Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint to `path` (created) and return it."""
    from omnistage.families.cosyvoice3.flow import CosyVoice3Flow, FlowConfig
    from omnistage.families.cosyvoice3.hift import CosyVoice3HiFT, HiFTConfig

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hidden = 32
    (path / "cosyvoice3.yaml").write_text(
        _YAML.format(hidden=hidden, speech_tokens=SPEECH_TOKENS, **FLOW, **HIFT)
    )
    llm = _text_model(path, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    special = 200
    llm["speech_embedding.weight"] = torch.randn(
        SPEECH_TOKENS + special, hidden, generator=generator
    )
    head = torch.randn(SPEECH_TOKENS + special, hidden, generator=generator) * 0.2
    head[SPEECH_TOKENS:] *= 0.25  # rarely ends early: requests run to their budget
    llm["llm_decoder.weight"] = head
    torch.save(llm, path / "llm.pt")
    with torch.random.fork_rng(devices=[]):
        flow = CosyVoice3Flow(FlowConfig.from_dict(FLOW))
        hift = CosyVoice3HiFT(HiFTConfig.from_dict(HIFT))
    torch.save(_randomized(flow, seed + 2, 0.05), path / "flow.pt")
    torch.save(_weight_normed(_randomized(hift, seed + 4, 0.05)), path / "hift.pt")
    voices = {
        name: _voice(path, seed + 10 * n, text) for n, (name, text) in enumerate(VOICES.items())
    }
    torch.save(voices, path / "spk2info.pt")
    tiny_onnx.make_speech_tokenizer(path / "speech_tokenizer_v3.onnx", seed + 5)
    tiny_onnx.make_campplus(path / "campplus.onnx", seed + 6)
    (path / "README.md").write_text(
        "A tiny random-weight CosyVoice3 checkpoint made by omnistage "
        "(omnistage/families/cosyvoice3/tiny.py); its speech is noise.\n"
    )
    return path
