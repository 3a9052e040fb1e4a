"""CosyVoice3's voices: what a cloned speaker conditions the LM and the flow with.

A voice is the reference's zero-shot speaker record (`CosyVoice.add_zero_shot_spk`,
saved as `spk2info.pt`, or an upload cloned by `clone.py`): the prompt text's token ids (a system line, `<|endofprompt|>`,
then the clip's transcript), the clip's speech tokens, its 80-bin mel frames (two per
token) and its 192-dim speaker embedding. The converted checkpoint keeps them in
`voices.pt`; the LM's prompter and the flow read the same file.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from omnistage.voice_store import VoiceStore

FILE = "voices.pt"


@dataclass(frozen=True)
class Voice:
    prompt_text: tuple[int, ...]
    speech_tokens: torch.Tensor
    """[tokens] long."""
    speech_feat: torch.Tensor
    """[2 * tokens, 80] float32 mel frames of the clip."""
    embedding: torch.Tensor
    """[192] float32 speaker embedding (CAM++)."""
    lm_speech: bool = True
    """Whether the LM's prompt holds the speech tokens (False: an uploaded clip without
    a transcript, the reference's cross-lingual mode)."""


def _check(name: str, record: dict) -> Voice:
    try:
        text = record["prompt_text"].reshape(-1).tolist()
        tokens = record["flow_prompt_speech_token"].reshape(-1).long()
        feat = record["prompt_speech_feat"].reshape(-1, record["prompt_speech_feat"].shape[-1])
        embedding = record["flow_embedding"].reshape(-1).float()
    except (KeyError, AttributeError, RuntimeError) as e:
        raise ValueError(f"spk2info.pt: voice {name!r} is not a zero-shot speaker ({e})") from e
    # The reference's frontend makes the clip's frames exactly twice its tokens.
    n = min(tokens.shape[0], feat.shape[0] // 2)
    return Voice(tuple(int(t) for t in text), tokens[:n], feat[: 2 * n].float(), embedding)


def convert_spk2info(source: Path, out: Path) -> None:
    """`spk2info.pt` (the reference's) -> `out/voices.pt` (checked, compact)."""
    try:
        records = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as e:  # a torch pickle that does not load says many things
        raise ValueError(f"{source}: cannot read the voices ({e})") from e
    if not isinstance(records, dict):
        raise ValueError(f"{source}: expected a dict of voices")
    voices = {}
    for name, record in records.items():
        voice = _check(str(name), record)
        voices[str(name)] = {
            "prompt_text": torch.tensor(voice.prompt_text, dtype=torch.long),
            "speech_tokens": voice.speech_tokens,
            "speech_feat": voice.speech_feat,
            "embedding": voice.embedding,
        }
    torch.save(voices, out / FILE)


@functools.cache
def _load(path: Path) -> dict[str, Voice]:
    file = path / FILE
    if not file.is_file():
        return {}
    records = torch.load(file, map_location="cpu", weights_only=True)
    return {
        name: Voice(
            tuple(r["prompt_text"].tolist()), r["speech_tokens"], r["speech_feat"], r["embedding"]
        )
        for name, r in records.items()
    }


def voices(path: str | Path) -> dict[str, Voice]:
    """The checkpoint's voices by name (none when it has no voices file)."""
    return _load(Path(path).resolve())


def speakers(path: str | Path) -> list[str]:
    """The voice names (`Family.voices` reader)."""
    return sorted(voices(path))


def voice(path: str | Path, name: str | None) -> Voice:
    """The voice `name` (case-insensitive; None: the first; a `voice-…` id: the upload,
    cloned by `clone.py`), ValueError naming the choices."""
    if VoiceStore.is_voice_id(name):
        from omnistage.families.cosyvoice3.clone import uploaded_voice

        return uploaded_voice(path, str(name))
    table = voices(path)
    if not table:
        raise ValueError(
            "voice: this CosyVoice3 checkpoint has no voices (add speakers with the reference's "
            "add_zero_shot_spk and save_spkinfo, which write spk2info.pt)"
        )
    if name is None:
        return table[sorted(table)[0]]
    by_lower = {k.lower(): k for k in table}
    if name.lower() not in by_lower:
        raise ValueError(
            f"voice: unknown voice {name!r}; this model has {', '.join(sorted(table))}"
        )
    return table[by_lower[name.lower()]]
