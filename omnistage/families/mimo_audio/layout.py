"""MiMo-Audio checkpoints as published, seen through the HF view omnistage loads.

The Hub's `XiaomiMiMo/MiMo-Audio-7B-*` folders are HF-style (sharded safetensors with
their index, a Qwen2 tokenizer with MiMo-Audio's added tokens) but their `config.json`
says `model_type: qwen2` (architectures `MiMoAudioModel`) and has no `<|empty|>` id:
the reference takes that id from the tokenizer. The audio tokenizer is a second repo,
`XiaomiMiMo/MiMo-Audio-Tokenizer`, found in the folder's `audio_tokenizer/` or beside
it as the reference's README downloads it (`models/MiMo-Audio-Tokenizer` next to
`models/MiMo-Audio-7B-Instruct`).

The registry claims such a folder by its architecture (`Family.architecture_layouts`);
`convert(folder, out)` writes the view: `config.json` with `model_type: mimo_audio` and
`empty_token_id` (the tokenizer's `<|empty|>` id), every other file of the folder linked,
and `audio_tokenizer` linked to the audio tokenizer. Links are relative, so the view
stays valid when its directory is renamed into place. The user's files are not touched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from omnistage.families.mimo_audio.config import MODEL_TYPE

ARCHITECTURE = "MiMoAudioModel"
"""`architectures` of the published config.json."""
EMPTY_TOKEN = "<|empty|>"
AUDIO_TOKENIZER = "audio_tokenizer"
"""The audio tokenizer's folder in the view (and where it may sit in the checkpoint)."""
SIBLING_TOKENIZER = "MiMo-Audio-Tokenizer"
"""Its folder beside the checkpoint in the reference's README layout."""


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def added_token_id(folder: Path, token: str) -> int | None:
    """The id of added token `token` in the tokenizer files of `folder` (tokenizer.json's
    `added_tokens`, tokenizer_config.json's `added_tokens_decoder`, added_tokens.json),
    or None where none names it."""
    tokenizer = _json(folder / "tokenizer.json") or {}
    for entry in tokenizer.get("added_tokens") or []:
        if isinstance(entry, dict) and entry.get("content") == token:
            return int(entry["id"])
    decoder = (_json(folder / "tokenizer_config.json") or {}).get("added_tokens_decoder") or {}
    for key, entry in decoder.items():
        if isinstance(entry, dict) and entry.get("content") == token:
            return int(key)
    added = _json(folder / "added_tokens.json") or {}
    return int(added[token]) if token in added else None


def audio_tokenizer_folder(folder: Path) -> Path:
    """The MiMo-Audio-Tokenizer checkpoint of `folder` (its `audio_tokenizer/`, else the
    sibling `MiMo-Audio-Tokenizer/`); ValueError naming both places when neither has it."""
    candidates = (folder / AUDIO_TOKENIZER, folder.parent / SIBLING_TOKENIZER)
    for candidate in candidates:
        if (candidate / "config.json").is_file():
            return candidate
    raise ValueError(
        f"model: {folder} is a MiMo-Audio checkpoint without its audio tokenizer: put "
        f"XiaomiMiMo/MiMo-Audio-Tokenizer in {candidates[0]} or {candidates[1]}"
    )


def _link(target: Path, link: Path) -> None:
    link.symlink_to(os.path.relpath(target.resolve(), link.parent.resolve()))


def convert(folder: Path, out: Path) -> None:
    """Write the HF view of the published checkpoint `folder` into `out` (ValueError
    naming what the folder lacks)."""
    folder, out = Path(folder), Path(out)
    config = _json(folder / "config.json")
    if not isinstance(config, dict):
        raise ValueError(f"model: {folder / 'config.json'} is not a JSON object")
    empty = added_token_id(folder, EMPTY_TOKEN)
    if empty is None:
        raise ValueError(
            f"model: the tokenizer of {folder} has no {EMPTY_TOKEN} token (MiMo-Audio's "
            "text id of speaking positions)"
        )
    tokenizer = audio_tokenizer_folder(folder)
    out.mkdir(parents=True, exist_ok=True)
    view = config | {"model_type": MODEL_TYPE, "empty_token_id": empty}
    (out / "config.json").write_text(json.dumps(view, indent=2) + "\n")
    for file in sorted(folder.iterdir()):
        if file.is_file() and file.name != "config.json":
            _link(file, out / file.name)
    _link(tokenizer, out / AUDIO_TOKENIZER)
