"""The reference peer of `omnistage bench tts`: the official `qwen-tts` 0.1.1 on the same
checkpoint, run by the benchmark as a separate process with the reference's own Python
(it pins transformers 4.57.3, so it never shares omnistage's environment):

    <reference python> path/to/qwen_tts_peer.py CHECKPOINT TEXTS_JSON FRAMES BATCH

It synthesizes the texts (greedy talker and sub-talker, speaker = the checkpoint's first,
`non_streaming_mode=True` as `generate_custom_voice` does) in batches of `BATCH`, one
`generate` call per batch plus the speech tokenizer's decode, after one warm-up call,
and prints one JSON line: wall seconds and audio seconds. Nothing here imports
omnistage; the imports run only as a script.
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import time
import types

ASSISTANT = "<|im_start|>assistant\n{}<|im_end|>\n<|im_start|>assistant\n"


def _stub_torchaudio() -> None:
    """The reference imports its 25 Hz tokenizer, whose torchaudio may not load against
    the installed torch; the 12 Hz model never calls it."""
    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules.setdefault(name, module)
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]


def main(path: str, texts_json: str, frames: int, batch: int) -> dict:
    _stub_torchaudio()
    import torch
    from qwen_tts.core.models import Qwen3TTSForConditionalGeneration
    from tokenizers import Tokenizer

    texts = json.loads(texts_json)
    tokenizer = Tokenizer.from_file(f"{path}/tokenizer.json")
    model = Qwen3TTSForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    speaker = next(iter(model.config.talker_config.spk_id))

    def synthesize(group: list[str]) -> float:
        ids = [
            torch.tensor([tokenizer.encode(ASSISTANT.format(t), add_special_tokens=False).ids])
            for t in group
        ]
        codes, _ = model.generate(
            input_ids=ids,
            languages=["auto"] * len(group),
            speakers=[speaker] * len(group),
            non_streaming_mode=True,
            max_new_tokens=frames + 1,  # the reference completes one frame less
            do_sample=False,
            subtalker_dosample=False,
        )
        wavs, rate = model.speech_tokenizer.decode([{"audio_codes": c} for c in codes])
        return sum(len(w) for w in wavs) / rate

    with torch.inference_mode():
        synthesize(texts[:1])
        start, audio = time.perf_counter(), 0.0
        for i in range(0, len(texts), batch):
            audio += synthesize(texts[i : i + batch])
        wall = time.perf_counter() - start
    return {"wall_s": wall, "audio_s": audio, "requests": len(texts), "batch": batch}


if __name__ == "__main__":
    path, texts_json, frames, batch = sys.argv[1:5]
    print(json.dumps(main(path, texts_json, int(frames), int(batch))))
