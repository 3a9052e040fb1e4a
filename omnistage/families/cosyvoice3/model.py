"""CosyVoice3's LM as a part of the converted checkpoint, on our hot path.

The reference's `CosyVoice3LM` is a Qwen2 decoder (`Qwen2Encoder`) read through its own
tables: the speech tokens' `speech_embedding` is its input embedding, `llm_decoder` its
head (no bias), over the 6561 speech tokens plus 200 special ids. The converted view
(`layout.py`) names them `model.embed_tokens` and `lm_head`, so this is our Qwen2 decoder
unchanged; the text embedding is the prompter's (`prompt.py`), not loaded here.
"""

from __future__ import annotations

from omnistage.families.llama.model import Qwen2ForCausalLM


class CosyVoice3LM(Qwen2ForCausalLM):
    architectures = ("OmnistageCosyVoice3LM",)
