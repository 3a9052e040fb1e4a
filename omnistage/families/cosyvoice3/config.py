"""CosyVoice3's settings as a transformers config (`model_type` "cosyvoice3").

A CosyVoice3 checkpoint has no config.json: `cosyvoice3.yaml` (HyperPyYAML) builds its
modules and `CosyVoice-BlankEN/config.json` is the Qwen2 text model inside the LM.
`layout.py` reads both once and writes this config into the checkpoint's converted
view; it holds the LM's decoder config (`llm_config`, a Qwen2 config whose vocabulary is
the speech tokens' table), the flow's and the vocoder's settings (their own dataclasses
read them), and the few numbers the reference hard-codes in its Python
(`cosyvoice/cli/model.py`, `cosyvoice/llm/llm.py`).
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig, Qwen2Config

SILENT_TOKENS = (1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323)
"""The speech tokens of silence and breath (CosyVoice3Model.silent_tokens)."""


class CosyVoice3Config(PretrainedConfig):
    """The whole checkpoint: the LM's decoder, the flow and the vocoder."""

    model_type = "cosyvoice3"
    sub_configs = {"llm_config": Qwen2Config}

    def __init__(
        self,
        llm_config: dict[str, Any] | Qwen2Config | None = None,
        flow_config: dict[str, Any] | None = None,
        hift_config: dict[str, Any] | None = None,
        speech_token_size: int = 6561,
        text_vocab_size: int = 151936,
        end_of_prompt_token_id: int = 151646,
        sample_rate: int = 24000,
        token_hop_len: int = 25,
        min_token_text_ratio: float = 2.0,
        max_token_text_ratio: float = 20.0,
        silent_tokens: list[int] | None = None,
        max_silent_tokens: int = 5,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(llm_config, Qwen2Config):
            llm_config = Qwen2Config(**(llm_config or {}))
        self.llm_config = llm_config
        self.flow_config = dict(flow_config or {})
        self.hift_config = dict(hift_config or {})
        self.speech_token_size = speech_token_size
        self.text_vocab_size = text_vocab_size
        self.end_of_prompt_token_id = end_of_prompt_token_id
        self.sample_rate = sample_rate
        self.token_hop_len = token_hop_len
        self.min_token_text_ratio = min_token_text_ratio
        self.max_token_text_ratio = max_token_text_ratio
        self.silent_tokens = list(SILENT_TOKENS if silent_tokens is None else silent_tokens)
        self.max_silent_tokens = max_silent_tokens

    # The LM's special speech ids (CosyVoice3LM: sos, eos, task id, fill, all past the
    # speech codebook; every id from `speech_token_size` on stops generation).
    @property
    def sos_token_id(self) -> int:
        return self.speech_token_size

    @property
    def eos_token_id_speech(self) -> int:
        return self.speech_token_size + 1

    @property
    def task_token_id(self) -> int:
        return self.speech_token_size + 2

    @property
    def stop_token_ids(self) -> list[int]:
        return list(range(self.speech_token_size, self.llm_config.vocab_size))
