"""The reference peer of `omnistage bench tts --model demo-cosyvoice3`: FunAudioLLM/CosyVoice
itself (its `CosyVoice3Model.tts`: the LM's sampling in a thread, the flow and HiFT on
the chunks it streams) on the same checkpoint, run by the benchmark as a separate process
with the reference's own Python (`.reference/cosyvoice-env`, made with its sources by
`tests/fixtures/cosyvoice3/make_reference_env.sh`; it never shares omnistage's
environment):

    <reference python> path/to/cosyvoice3_peer.py CHECKPOINT TEXTS_JSON SEED [whole]

The reference's modules are built on the checkpoint by the fixture script's `build`
(`tests/fixtures/cosyvoice3/make_pipeline_fixture.py`, whose `reference_env` installs the
stand-ins for modules the inference path never calls). Each text is spoken zero-shot with
the checkpoint's first voice by name (`spk2info.pt`; what omnistage speaks with when a
request names none), one request at a time, streamed (`stream=True`, the reference's
only streaming: chunks of 25, 50, then 100 tokens) unless `whole` is given, after one
warm-up request; `torch.manual_seed(SEED)` before each. Printed: one JSON line, per
request its text tokens, its budget, the speech tokens the LM wrote and those spoken,
the seconds to the first audio and to the end, and the audio seconds.

Where this differs from calling the reference's `CosyVoice3.inference_zero_shot`, each
the smallest change that makes the work the same as omnistage's:
- the frontend is skipped: the text is tokenized as-is (the fixture's tokenizer, as
  omnistage's prompter does), with no text normalization or sentence split (a text of
  4-8 random words is one sentence);
- sampling is the real model's `ras_sampling` (top-p 0.8, top-k 25, window 10, tau_r 0.1;
  the tiny `cosyvoice3.yaml` names none), with every stop id masked until the budget
  (20 speech tokens per text token) is written: omnistage's random-weight LM runs to that
  budget, and the reference's own stop (even before `min_len` it masks only `sos`) would
  end its requests earlier, at random lengths, and so do less work;
- `token_hop_len` is set back to 25 before each request: `tts` grows it to 100 on the
  model and never resets it, so every request after the first would start with a
  100-token chunk;
- `<|endofprompt|>`: the reference asserts the hard-coded id 151646 is in the text; the
  tiny tokenizer's id is smaller, so that one membership test is redirected (the
  fixture's shim).
From omnistage it imports only the tokenizer's special tokens (`families/cosyvoice3/
layout.py`, torch and yaml only, as the fixture script does); the imports run only as a
script.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "cosyvoice3"
HOP = 25
RATIO = 20
"""The reference's `max_token_text_ratio`: speech tokens per text token at most."""


def _sampling(llm, budgets: dict[str, int]):
    """`llm.sampling_ids` with `ras_sampling`, every stop id masked until the budget."""
    import torch
    from cosyvoice.utils.common import ras_sampling

    llm.sampling = functools.partial(ras_sampling, top_p=0.8, top_k=25, win_size=10, tau_r=0.1)
    stops = torch.tensor(sorted(llm.stop_token_ids))

    def sampling_ids(scores, decoded, sampling, ignore_eos=True):
        if len(decoded) < budgets["max"]:
            scores[stops] = -float("inf")
        return llm.sampling(scores, decoded, sampling)

    llm.sampling_ids = sampling_ids


def _redirect_end_of_prompt(end_of_prompt: int) -> None:
    import torch

    contains = torch.Tensor.__contains__
    torch.Tensor.__contains__ = lambda t, x: contains(t, end_of_prompt if x == 151646 else x)


def main(path: Path, texts: list[str], seed: int, stream: bool) -> dict:
    sys.path.insert(0, str(FIXTURES))
    import torch
    from make_pipeline_fixture import build  # installs the reference's stand-ins first
    from transformers import AutoTokenizer

    sys.path.insert(0, str(FIXTURES.parents[2]))
    from omnistage.families.cosyvoice3.layout import SPECIAL_TOKENS  # torch and yaml only

    tokenizer = AutoTokenizer.from_pretrained(path / "CosyVoice-BlankEN")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    _redirect_end_of_prompt(tokenizer.convert_tokens_to_ids("<|endofprompt|>"))
    spk2info = torch.load(path / "spk2info.pt", weights_only=True)
    name = sorted(spk2info)[0]
    torch.manual_seed(seed)
    model = build(path)
    budgets = {"max": 0}
    _sampling(model.llm, budgets)
    written: list[int] = []
    original = model.llm.inference_wrapper

    def counted(*args, **kwargs):
        for token in original(*args, **kwargs):
            written[-1] += 1
            yield token

    model.llm.inference_wrapper = counted
    spoken: list[int] = []
    llm_job = model.llm_job

    def spoken_job(*args):  # the tokens `tts` speaks: the LM's, less long silences
        llm_job(*args)
        spoken.append(len(model.tts_speech_token_dict[args[-1]]))

    model.llm_job = spoken_job

    def speak(text: str) -> dict:
        ids = tokenizer([text])["input_ids"][0]
        inputs = dict(spk2info[name])
        inputs["text"] = torch.tensor([ids], dtype=torch.int32)
        inputs["text_len"] = torch.tensor([len(ids)], dtype=torch.int32)
        budgets["max"] = int(len(ids) * RATIO)
        model.token_hop_len = HOP
        torch.manual_seed(seed)
        written.append(0)
        samples, first, start = 0, None, time.perf_counter()
        for out in model.tts(**inputs, stream=stream):
            first = first if first is not None else time.perf_counter() - start
            samples += out["tts_speech"].shape[1]
        wall = time.perf_counter() - start
        return {
            "text_tokens": len(ids),
            "budget": budgets["max"],
            "tokens": written[-1],
            "spoken_tokens": spoken[-1],
            "first_audio_s": first,
            "wall_s": wall,
            "audio_samples": samples,
            "audio_s": samples / model.hift.sampling_rate,
        }

    with torch.inference_mode():
        speak("warm up")
        requests = [speak(t) for t in texts]
    mode = "stream" if stream else "whole"
    return {"voice": name, "mode": mode, "seed": seed, "requests": requests}


if __name__ == "__main__":
    path, texts_json, seed = sys.argv[1:4]
    stream = sys.argv[4:5] != ["whole"]
    print(json.dumps(main(Path(path), json.loads(texts_json), int(seed), stream)))
