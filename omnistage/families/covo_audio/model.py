"""Covo-Audio's fused thinker + talker: one Qwen2 decoder over text ids and speech codes.

The checkpoint's `llm.*` weights (`CovoAudioForCausalLM.llm`, a transformers
`Qwen2ForCausalLM`, its head not tied to its embedding) on our hot path; the family's
`PartSpec` maps `llm.model.` / `llm.lm_head.` onto ours. Its vocabulary is the text
tokenizer's ids, then `token_vocab_size` speech codes from `audio_token_index` on: one
sequence interleaves the reply's text and its speech, which code2wav picks out
(`code2wav.speech_codes`). Audio in (Whisper encoder + `audio_adapter` rows in place of
`<|cAUDIO|>` ids) is the stage's input encoder (`audio_input.py`), not this part.
"""

from __future__ import annotations

from omnistage.families.llama.model import Qwen2ForCausalLM


class CovoAudioLM(Qwen2ForCausalLM):
    architectures = ("OmnistageCovoAudioLM",)
