"""Cloning an uploaded clip for CosyVoice3: a clip and its transcript -> a `Voice`.

What the reference's `frontend_zero_shot` computes from a prompt clip
(`cosyvoice/cli/frontend.py`), the same way:

- speech tokens: `speech_tokenizer_v3.onnx` on the clip's whisper log-mel at 16 kHz;
- the flow's prompt features: the 80-bin mel at 24 kHz (`clone_features.prompt_mel`);
- the x-vector: `campplus.onnx` (CAM++, 192-d) on the mean-normalised 80-bin Kaldi fbank
  at 16 kHz;
- then tokens and features cut to a common length, two frames per token.

Both networks ship only as ONNX files, so they run with onnxruntime on the CPU, as the
reference runs them (same graphs, same runtime: no port of two architectures to keep
in step with their exports). The features feeding them are our torch code
(`clone_features.py`). A voice is computed once per process and voice (the LM's
prompter and the flow both ask for it) and kept while it exists in the store.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.families.cosyvoice3 import clone_features as cf
from omnistage.voice_store import SAMPLE_RATE, VoiceStore

SPEECH_TOKENIZER = "speech_tokenizer_v3.onnx"
CAMPPLUS = "campplus.onnx"
CLONE_FILES = (SPEECH_TOKENIZER, CAMPPLUS)
END_OF_PROMPT = "<|endofprompt|>"
SYSTEM_PROMPT = "You are a helpful assistant." + END_OF_PROMPT
"""Put before a transcript that has no `<|endofprompt|>` (the reference's examples)."""


@functools.cache
def _session(file: Path) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(
        str(file), sess_options=options, providers=["CPUExecutionProvider"]
    )


def session(path: Path, name: str) -> Any:
    """The onnxruntime session of the checkpoint's `name`; ValueError naming `voice` when
    the checkpoint lacks it (it cannot clone uploads then)."""
    file = Path(path) / name
    if not file.is_file():
        raise ValueError(
            f"voice: this CosyVoice3 checkpoint has no {name}, so it cannot clone uploaded "
            f"voices (a Fun-CosyVoice3 checkpoint ships {' and '.join(CLONE_FILES)})"
        )
    return _session(file.resolve())


def speech_tokens(path: Path, audio16: torch.Tensor) -> torch.Tensor:
    """`[tokens]` long: the speech tokenizer's ids for a 16 kHz clip."""
    tokenizer = session(path, SPEECH_TOKENIZER)
    feat = cf.whisper_log_mel(audio16).unsqueeze(0).numpy()
    inputs = tokenizer.get_inputs()
    out = tokenizer.run(
        None,
        {inputs[0].name: feat, inputs[1].name: np.array([feat.shape[2]], dtype=np.int32)},
    )[0]
    return torch.from_numpy(np.asarray(out)).reshape(-1).long()


def speaker_embedding(path: Path, audio16: torch.Tensor) -> torch.Tensor:
    """`[192]` float32: CAM++'s x-vector of a 16 kHz clip."""
    campplus = session(path, CAMPPLUS)
    feat = cf.kaldi_fbank(audio16)
    feat = feat - feat.mean(dim=0, keepdim=True)
    out = campplus.run(None, {campplus.get_inputs()[0].name: feat.unsqueeze(0).numpy()})[0]
    return torch.from_numpy(np.asarray(out, dtype=np.float32)).reshape(-1)


def clip_features(
    path: Path, clip24: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(speech tokens `[n]`, prompt mel `[2n, 80]`, x-vector `[192]`) of a 24 kHz clip,
    tokens and frames cut to two frames per token (the reference's `resample_rate ==
    24000` branch)."""
    from omnistage.multimodal.media import resample_audio

    audio16 = torch.from_numpy(resample_audio(clip24, SAMPLE_RATE, cf.WHISPER_RATE))
    tokens = speech_tokens(path, audio16)
    feat = cf.prompt_mel(torch.from_numpy(np.asarray(clip24, dtype=np.float32)))
    n = min(feat.shape[0] // 2, tokens.shape[0])
    return tokens[:n], feat[: 2 * n], speaker_embedding(path, audio16)


def prompt_text(transcript: str | None) -> str:
    """The zero-shot prompt text of a transcript (the system line unless it has its own
    `<|endofprompt|>`); a clip without one prompts with the system line alone."""
    text = (transcript or "").strip()
    return text if END_OF_PROMPT in text else SYSTEM_PROMPT + text


@functools.cache
def _tokenizer(path: Path) -> Any:
    from omnistage.models.registry import auto_config_and_tokenizer

    return auto_config_and_tokenizer(path, "CosyVoice3")[1]  # the prompter's tokenizer


@functools.lru_cache(maxsize=64)
def _cloned(path: Path, voice_id: str, created_ns: int) -> Any:
    from omnistage.families.cosyvoice3.voices import Voice

    store = VoiceStore.for_model(path)
    record = store.get(voice_id) or {}
    tokens, feat, embedding = clip_features(path, store.audio(voice_id))
    ids = _tokenizer(path)([prompt_text(record.get("text"))])["input_ids"][0]
    # Without a transcript the LM is not shown the clip's tokens (the reference's
    # cross-lingual mode); the flow still speaks in the clip's voice.
    return Voice(
        tuple(int(i) for i in ids), tokens, feat, embedding, lm_speech=bool(record.get("text"))
    )


def uploaded_voice(path: str | Path, voice_id: str) -> Any:
    """The `Voice` of an upload to this checkpoint's store; ValueError naming `voice`."""
    path = Path(path).resolve()
    record = VoiceStore.for_model(path).get(voice_id)
    if record is None:
        raise ValueError(f"voice: no uploaded voice {voice_id!r}")
    return _cloned(path, voice_id, int(record.get("created_ns", 0)))
