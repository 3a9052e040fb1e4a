"""The CosyVoice3 checkpoint layout, converted once into the HF view omnistage loads.

A CosyVoice3 checkpoint (`FunAudioLLM/Fun-CosyVoice3-0.5B-2512`) is a folder with
`cosyvoice3.yaml` (HyperPyYAML: module classes and their arguments), three PyTorch state
dicts (`llm.pt`, `flow.pt`, `hift.pt`), the Qwen2 text model's config and tokenizer under
`CosyVoice-BlankEN/`, and optionally `spk2info.pt` (the reference's saved zero-shot
voices). `convert(src, out)` writes:

- `config.json`: `CosyVoice3Config` (the yaml's sizes; no yaml class is instantiated);
- `model.safetensors`: the LM as a Qwen2 decoder over the speech tokens (`model.*`,
  its input table the LM's `speech_embedding`, `lm_head` its `llm_decoder`), the text
  embedding the prompter reads (`text_embedding.weight`), `flow.*` and `hift.*`;
- the tokenizer with CosyVoice3's special tokens added (`CosyVoice3Tokenizer`);
- `voices.pt` from `spk2info.pt` (see `voices.py`);
- links to `speech_tokenizer_v3.onnx` and `campplus.onnx` where the folder has them (the
  networks that clone uploaded clips, `clone.py`; about 1 GB together, so not copied).

`models/loader.resolve_model` finds such folders through `Family.layouts` and keeps the
converted view in the cache directory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
import yaml

YAML_FILE = "cosyvoice3.yaml"
TEXT_MODEL = "CosyVoice-BlankEN"
STATE_FILES = ("llm.pt", "flow.pt", "hift.pt")
VOICES_SOURCE = "spk2info.pt"
STOP_TOKEN_COUNT = 200
"""CosyVoice3LM's table and head hold the speech codebook plus 200 special ids."""

SPECIAL_TOKENS = [
    "<|im_start|>", "<|im_end|>", "<|endofprompt|>", "[breath]", "<strong>", "</strong>",
    "[noise]", "[laughter]", "[cough]", "[clucking]", "[accent]", "[quick_breath]",
    "<laughter>", "</laughter>", "[hissing]", "[sigh]", "[vocalized-noise]", "[lipsmack]",
    "[mn]", "<|endofsystem|>",
    *(f"[{p}]" for p in ["AA", "AA0", "AA1", "AA2", "AE", "AE0", "AE1", "AE2", "AH", "AH0", "AH1", "AH2", "AO", "AO0", "AO1", "AO2", "AW", "AW0", "AW1", "AW2", "AY", "AY0", "AY1", "AY2", "B", "CH", "D", "DH", "EH", "EH0", "EH1", "EH2", "ER", "ER0", "ER1", "ER2", "EY", "EY0", "EY1", "EY2", "F", "G", "HH", "IH", "IH0", "IH1", "IH2", "IY", "IY0", "IY1", "IY2", "JH", "K", "L", "M", "N", "NG", "OW", "OW0", "OW1", "OW2", "OY", "OY0", "OY1", "OY2", "P", "R", "S", "SH", "T", "TH", "UH", "UH0", "UH1", "UH2", "UW", "UW0", "UW1", "UW2", "V", "W", "Y", "Z", "ZH", "a", "ai", "an", "ang", "ao", "b", "c", "ch", "d", "e", "ei", "en", "eng", "f", "g", "h", "i", "ian", "in", "ing", "iu", "ià", "iàn", "iàng", "iào", "iá", "ián", "iáng", "iáo", "iè", "ié", "iòng", "ióng", "iù", "iú", "iā", "iān", "iāng", "iāo", "iē", "iě", "iōng", "iū", "iǎ", "iǎn", "iǎng", "iǎo", "iǒng", "iǔ", "j", "k", "l", "m", "n", "o", "ong", "ou", "p", "q", "r", "s", "sh", "t", "u", "uang", "ue", "un", "uo", "uà", "uài", "uàn", "uàng", "uá", "uái", "uán", "uáng", "uè", "ué", "uì", "uí", "uò", "uó", "uā", "uāi", "uān", "uāng", "uē", "uě", "uī", "uō", "uǎ", "uǎi", "uǎn", "uǎng", "uǐ", "uǒ", "vè", "w", "x", "y", "z", "zh", "à", "ài", "àn", "àng", "ào", "á", "ái", "án", "áng", "áo", "è", "èi", "èn", "èng", "èr", "é", "éi", "én", "éng", "ér", "ì", "ìn", "ìng", "í", "ín", "íng", "ò", "òng", "òu", "ó", "óng", "óu", "ù", "ùn", "ú", "ún", "ā", "āi", "ān", "āng", "āo", "ē", "ēi", "ēn", "ēng", "ě", "ěi", "ěn", "ěng", "ěr", "ī", "īn", "īng", "ō", "ōng", "ōu", "ū", "ūn", "ǎ", "ǎi", "ǎn", "ǎng", "ǎo", "ǐ", "ǐn", "ǐng", "ǒ", "ǒng", "ǒu", "ǔ", "ǔn", "ǘ", "ǚ", "ǜ"]),
]  # fmt: skip
"""`CosyVoice3Tokenizer`'s additional special tokens, in its order (cosyvoice/tokenizer)."""


def is_cosyvoice3(path: Path) -> bool:
    return (Path(path) / YAML_FILE).is_file()


# -- cosyvoice3.yaml --------------------------------------------------------------------------
class _TagTolerantLoader(yaml.SafeLoader):
    """Reads HyperPyYAML as plain data: `!new:`/`!name:` mappings stay mappings, `!ref`
    stays a string to resolve, `!apply:` is dropped."""


def _tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    value = loader.construct_scalar(node)
    return ("ref", value) if suffix == "ref" else value


_TagTolerantLoader.add_multi_constructor("!", _tagged)


def read_yaml(path: Path) -> dict[str, Any]:
    """The yaml's values with `!ref <key>` (and products of refs) resolved."""
    try:
        raw = yaml.load(Path(path).read_text(), Loader=_TagTolerantLoader)  # noqa: S506
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({e})") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping at the top")

    def resolve(value: Any) -> Any:
        if isinstance(value, tuple) and value[:1] == ("ref",):
            return product(value[1])
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v) for v in value]
        return value

    def product(expression: str) -> Any:
        """`<key>` is the key's value; `<a> * <b>` (all CosyVoice3 uses) their product."""
        factors = [f.strip() for f in expression.split("*")]
        values = []
        for factor in factors:
            match = re.fullmatch(r"<([\w.]+)>", factor)
            if match is not None:
                values.append(resolve(raw.get(match.group(1))))
            elif re.fullmatch(r"-?\d+", factor):
                values.append(int(factor))
            else:
                raise ValueError(f"{path}: cannot resolve !ref {expression!r}")
        if len(values) == 1:
            return values[0]
        if not all(isinstance(v, int) for v in values):
            raise ValueError(f"{path}: !ref {expression!r} multiplies non-integers")
        result = 1
        for v in values:
            result *= v
        return result

    return resolve(raw)


def _section(config: dict[str, Any], *keys: str) -> dict[str, Any]:
    node: Any = config
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise ValueError(f"{YAML_FILE}: missing section {'.'.join(keys)}")
    return node


def flow_settings(config: dict[str, Any]) -> dict[str, Any]:
    """`FlowConfig` fields from the yaml's `flow:` section."""
    flow = _section(config, "flow")
    lookahead = _section(config, "flow", "pre_lookahead_layer")
    cfm = _section(config, "flow", "decoder", "cfm_params", "content")
    dit = _section(config, "flow", "decoder", "estimator")
    return {
        "input_size": flow.get("input_size", 80),
        "output_size": flow.get("output_size", 80),
        "spk_embed_dim": flow.get("spk_embed_dim", 192),
        "vocab_size": flow.get("vocab_size", 6561),
        "token_mel_ratio": flow.get("token_mel_ratio", 2),
        "pre_lookahead_len": flow.get("pre_lookahead_len", 3),
        "pre_lookahead_channels": lookahead.get("channels", 1024),
        "dit_dim": dit["dim"],
        "dit_depth": dit["depth"],
        "dit_heads": dit["heads"],
        "dit_dim_head": dit["dim_head"],
        "dit_ff_mult": dit["ff_mult"],
        "static_chunk_size": dit["static_chunk_size"],
        "inference_cfg_rate": float(cfm.get("inference_cfg_rate", 0.7)),
        "sigma_min": float(cfm.get("sigma_min", 1e-6)),
        "t_scheduler": cfm.get("t_scheduler", "cosine"),
    }


_HIFT_KEYS = (
    "in_channels", "base_channels", "nb_harmonics", "sampling_rate", "nsf_alpha", "nsf_sigma",
    "nsf_voiced_threshold", "upsample_rates", "upsample_kernel_sizes", "resblock_kernel_sizes",
    "resblock_dilation_sizes", "source_resblock_kernel_sizes",
    "source_resblock_dilation_sizes", "lrelu_slope", "audio_limit", "conv_pre_look_right",
)  # fmt: skip


def hift_settings(config: dict[str, Any]) -> dict[str, Any]:
    """`HiFTConfig` fields from the yaml's `hift:` section."""
    hift = _section(config, "hift")
    settings = {k: hift[k] for k in _HIFT_KEYS if k in hift}
    istft = hift.get("istft_params") or {}
    settings["n_fft"], settings["hop_len"] = istft.get("n_fft", 16), istft.get("hop_len", 4)
    f0 = hift.get("f0_predictor") or {}
    settings["f0_cond_channels"] = f0.get("cond_channels", 512)
    for key, value in settings.items():
        if isinstance(value, list):
            settings[key] = [tuple(v) if isinstance(v, list) else v for v in value]
    return settings


# -- conversion -------------------------------------------------------------------------------
def _state(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # a torch pickle that does not load says many things
        raise ValueError(f"{path}: cannot read the state dict ({e})") from e
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state dict")
    return state


def lm_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`llm.pt` names -> the Qwen2 decoder's over the speech tokens (+ the text table)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name == "llm.model.model.embed_tokens.weight":
            out["text_embedding.weight"] = tensor
        elif name.startswith("llm.model.model."):
            out["model." + name[len("llm.model.model.") :]] = tensor
        elif name == "speech_embedding.weight":
            out["model.embed_tokens.weight"] = tensor
        elif name == "llm_decoder.weight":
            out["lm_head.weight"] = tensor
        # llm.model.lm_head (the text head) is never used
    for needed in ("text_embedding.weight", "model.embed_tokens.weight", "lm_head.weight"):
        if needed not in out:
            raise ValueError(f"llm.pt: no weight for {needed} (is this a CosyVoice3 LM?)")
    return out


def _config(src: Path, yaml_config: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    text_config_file = src / TEXT_MODEL / "config.json"
    if not text_config_file.is_file():
        raise ValueError(f"model: {text_config_file} is missing (the LM's Qwen2 config)")
    llm = json.loads(text_config_file.read_text())
    speech_token_size = int(_section(yaml_config, "llm").get("speech_token_size", 6561))
    text_vocab = llm.get("vocab_size")
    llm.update(
        vocab_size=speech_token_size + STOP_TOKEN_COUNT,
        tie_word_embeddings=False,
        architectures=["OmnistageCosyVoice3LM"],
    )
    llm.pop("torch_dtype", None)
    end_of_prompt = tokenizer.convert_tokens_to_ids("<|endofprompt|>")
    return {
        "model_type": "cosyvoice3",
        "architectures": ["OmnistageCosyVoice3"],
        "llm_config": llm,
        "flow_config": flow_settings(yaml_config),
        "hift_config": hift_settings(yaml_config),
        "speech_token_size": speech_token_size,
        "text_vocab_size": text_vocab,
        "end_of_prompt_token_id": end_of_prompt,
        "sample_rate": int(yaml_config.get("sample_rate", 24000)),
        "token_hop_len": int(yaml_config.get("chunk_size", 25)),
        "torch_dtype": "float32",
    }


def convert(src: Path, out: Path) -> None:
    """Write the HF view of the CosyVoice3 checkpoint `src` into the empty folder `out`."""
    import safetensors.torch
    from transformers import AutoTokenizer

    from omnistage.families.cosyvoice3.clone import CLONE_FILES
    from omnistage.families.cosyvoice3.voices import convert_spk2info

    src = Path(src)
    for name in (YAML_FILE, *STATE_FILES):
        if not (src / name).is_file():
            raise ValueError(f"model: {src / name} is missing (a CosyVoice3 checkpoint has it)")
    yaml_config = read_yaml(src / YAML_FILE)
    try:
        tokenizer = AutoTokenizer.from_pretrained(src / TEXT_MODEL, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"model: cannot load the tokenizer of {src / TEXT_MODEL} ({e})") from e
    tokenizer.add_special_tokens(
        {
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "additional_special_tokens": SPECIAL_TOKENS,
        }  # fmt: skip
    )
    config = _config(src, yaml_config, tokenizer)
    weights = lm_weights(_state(src / "llm.pt"))
    weights.update({"flow." + k: v for k, v in _state(src / "flow.pt").items()})
    hift = _state(src / "hift.pt")
    weights.update({"hift." + k.replace("generator.", ""): v for k, v in hift.items()})
    weights = {k: v.contiguous() for k, v in weights.items()}
    safetensors.torch.save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(out)
    if (src / VOICES_SOURCE).is_file():
        convert_spk2info(src / VOICES_SOURCE, out)
    for name in CLONE_FILES:  # the clone front end's networks (clone.py), linked not copied
        if (src / name).is_file():
            (out / name).symlink_to((src / name).resolve())
