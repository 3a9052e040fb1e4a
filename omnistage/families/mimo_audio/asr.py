"""MiMo-Audio's ASR task (audio in -> transcript) as the reference asks for it.

`MimoAudio.asr_sft` (`src/mimo_audio/mimo_audio.py`) lays its prompt out as
`get_asr_sft_prompt` does: `<|im_start|>user\\n`, the clip's audio segment, an instruction
(drawn at random from its `asr_zh_templates + asr_en_templates`; here the caller's, by
default the first English one), `<|im_end|>\\n<|im_start|>assistant\\n`, then an empty
thinking span `<think>\\n\\n</think>\\n`. It decodes greedily (the `asr` task sampler),
stops at the tokenizer's eos or `<|im_end|>`, and `forward` turns the text channel without
its last position into the transcript: decoded, stripped, `<|empty|>`, `<|eot|>` and
`<|eostm|>` removed.

`asr_request` is that prompt for `Omni.generate` (the clip in `multi_modal_data`, expanded
by `audio_input.py` as a chat turn's clip is), `asr_sampling` its sampler, `transcript`
the cleanup of the reply's text. Only the `lm` stage's text matters: ask for the text
modality, or ignore the (empty) audio.
"""

from __future__ import annotations

from typing import Any

ASR_INSTRUCTION = "Please transcribe this audio file"
"""The reference's first English ASR template."""
AUDIO_SPAN = "<|sosp|><|empty|><|eosp|>"
"""One clip's placeholder (`audio_input.py` expands it to the clip's positions)."""
THINK = "<think>\n\n</think>\n"
REMOVED = ("<|empty|>", "<|eot|>", "<|eostm|>")


def asr_prompt(instruction: str = ASR_INSTRUCTION) -> str:
    """The rendered ASR prompt with one clip's placeholder."""
    if not isinstance(instruction, str) or not instruction.strip():
        raise ValueError("instruction: expected a non-empty string")
    return f"<|im_start|>user\n{AUDIO_SPAN}{instruction}<|im_end|>\n<|im_start|>assistant\n{THINK}"


def asr_request(audio: Any, instruction: str = ASR_INSTRUCTION) -> dict[str, Any]:
    """An `Omni.generate` prompt asking for the transcript of `audio` (a path, file bytes
    or `(samples, sampling_rate)`)."""
    return {"prompt": asr_prompt(instruction), "multi_modal_data": {"audio": audio}}


def asr_sampling(tokenizer: Any, max_tokens: int = 8192) -> Any:
    """The reference's ASR sampler: greedy, stopping at the eos or `<|im_end|>`."""
    from omnistage.sampling_params import SamplingParams

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if not isinstance(end, int) or end == tokenizer.unk_token_id:
        raise ValueError("tokenizer: has no <|im_end|> token")
    stops = sorted({end, *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])})
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=stops)


def transcript(tokenizer: Any, token_ids: list[int]) -> str:
    """The reference's transcript of a reply's text tokens (its last position dropped)."""
    text = tokenizer.decode(token_ids[:-1], skip_special_tokens=False).strip()
    for special in REMOVED:
        text = text.replace(special, "")
    return text
