"""CosyVoice3's LM prompt: text and a voice in, the LM's prompt embeddings out.

The reference (`CosyVoice3LM.inference`) feeds the LM
`[sos] + text_embedding(prompt_text + text) + [task_id] + speech_embedding(prompt speech)`,
where `sos` and `task_id` are rows of the speech table past the codebook, and lets it
write between `min_token_text_ratio` and `max_token_text_ratio` speech tokens per text
token, ending at any id past the codebook. The modes of the reference's frontend:

- a voice (zero-shot clone, `inference_zero_shot`): `prompt_text` is the voice's (a
  system line, `<|endofprompt|>`, the clip's transcript) and the prompt speech its tokens;
- a voice and `instructions` (`inference_instruct2`): `prompt_text` is the instruction
  ("You are a helpful assistant. <instruction><|endofprompt|>"), no prompt speech; the
  flow still speaks with the voice.

The text table is the Qwen vocabulary at the LM's width (136 MB in float32 on the real
model): only the rows a request uses are read from the converted checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnistage.core.stage_input import StageInput, TokenBudget
from omnistage.families.cosyvoice3 import voices

TEXT_TABLE = "text_embedding.weight"
SPEECH_TABLE = "model.embed_tokens.weight"
END_OF_PROMPT = "<|endofprompt|>"
SYSTEM_LINE = "You are a helpful assistant."
MAX_TEXT_TOKENS = 1024
MAX_INSTRUCTION_TOKENS = 256


class RowReader:
    """Rows of one table in a checkpoint's safetensors, read on demand."""

    def __init__(self, path: Path, name: str, dtype: torch.dtype) -> None:
        import safetensors

        from omnistage.models.loader import safetensors_files

        self.name, self.dtype = name, dtype
        for file in safetensors_files(path):
            with safetensors.safe_open(file, framework="pt") as f:
                if name in f.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
                    self.file, self.rows = file, int(f.get_slice(name).get_shape()[0])
                    return
        raise ValueError(f"{path}: no tensor {name} (is this a converted CosyVoice3 checkpoint?)")

    def __call__(self, ids: list[int]) -> torch.Tensor:
        import safetensors

        with safetensors.safe_open(self.file, framework="pt") as f:
            table = f.get_slice(self.name)
            return torch.cat([table[i : i + 1] for i in ids]).to(self.dtype)


class CosyVoice3Prompter:
    """Builds the LM's prompt for a request (`SubmitRequest`: prompt = the text, voice,
    instructions) and its token budget."""

    def __init__(self, config: Any, tokenizer: Any, path: Path, dtype: torch.dtype) -> None:
        self.config, self.tokenizer, self.path = config, tokenizer, Path(path)
        self.text_rows = RowReader(self.path, TEXT_TABLE, dtype)
        self.speech_rows = RowReader(self.path, SPEECH_TABLE, dtype)

    @classmethod
    def from_checkpoint(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> Any:
        from omnistage.models.registry import auto_config_and_tokenizer

        path = Path(path)
        config, tokenizer = auto_config_and_tokenizer(path, "CosyVoice3")
        return cls(config, tokenizer, path, dtype)

    def tokens(self, text: str) -> list[int]:
        return list(self.tokenizer([text])["input_ids"][0])

    def request_input(self, stage: str, msg: Any) -> tuple[StageInput, TokenBudget]:
        text = msg.prompt
        if not isinstance(text, str) or not text.strip():
            raise ValueError("input: the text to speak is empty")
        ids = self.tokens(text)
        if len(ids) > MAX_TEXT_TOKENS:
            raise ValueError(f"input: {len(ids)} tokens, over the limit of {MAX_TEXT_TOKENS}")
        voice = voices.voice(self.path, msg.voice)
        if msg.instructions:
            prompt_text, prompt_speech = self.instruction(msg.instructions), []
        else:
            prompt_text = list(voice.prompt_text)
            prompt_speech = voice.speech_tokens.tolist() if voice.lm_speech else []
        return self.build(prompt_text, ids, prompt_speech), self.budget(len(ids))

    def instruction(self, instructions: str) -> list[int]:
        """The prompt text of an instruction (the reference's examples' form)."""
        text = instructions.strip()
        if END_OF_PROMPT not in text:
            text = f"{SYSTEM_LINE} {text}{END_OF_PROMPT}"
        ids = self.tokens(text)
        if len(ids) > MAX_INSTRUCTION_TOKENS:
            raise ValueError(
                f"instructions: {len(ids)} tokens, over the limit of {MAX_INSTRUCTION_TOKENS}"
            )
        return ids

    def build(
        self, prompt_text: list[int], text: list[int], prompt_speech: list[int]
    ) -> StageInput:
        """The LM's prompt embeddings (module docstring)."""
        c = self.config
        if c.end_of_prompt_token_id not in prompt_text + text:
            raise ValueError(
                f"input: CosyVoice3 needs {END_OF_PROMPT} in the voice's prompt text, the "
                "instructions or the text"
            )
        all_text = prompt_text + text
        bad = [i for i in all_text if not 0 <= i < self.text_rows.rows]
        if bad:
            raise ValueError(f"input: token id {bad[0]} is outside the text vocabulary")
        speech = [c.sos_token_id] + [c.task_token_id] + prompt_speech
        rows = self.speech_rows(speech)
        embeds = torch.cat([rows[:1], self.text_rows(all_text), rows[1:]])
        # Ids of the positions (prefix-cache keys also hash the embeddings): the speech ids
        # where a speech row is fed, `sos` for the text positions.
        ids = [c.sos_token_id] * (1 + len(all_text)) + speech[1:]
        return StageInput(prompt_token_ids=ids, prompt_embeds=embeds)

    def budget(self, text_tokens: int) -> TokenBudget:
        """Between 2 and 20 speech tokens per text token (the reference's ratios), ending
        at any id past the codebook once the least is written."""
        c = self.config
        return TokenBudget(
            max_tokens=int(text_tokens * c.max_token_text_ratio),
            min_tokens=int(text_tokens * c.min_token_text_ratio),
            stop_token_ids=tuple(c.stop_token_ids),
        )
