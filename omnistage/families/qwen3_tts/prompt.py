"""`Qwen3TTSPrompter`: a text-to-speech request as Qwen3-TTS's talker takes it.

As the reference builds it (`qwen_tts` 0.1.1, `Qwen3TTSForConditionalGeneration.generate`),
for one request; `T(ids)` is a projected text row, `C(ids)` a codec embedding:

- the text is tokenized inside `<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>
  assistant\\n`; the role rows are `T` of its first three tokens;
- the codec prefix is `think, think_bos, language, think_eos` (or `nothink, think_bos,
  think_eos` for language "auto"), the speaker row (a named speaker's codec
  embedding, a cloned voice's x-vector — the Base checkpoint's speaker encoder on the
  uploaded clip (`omnistage.voice_store`); none for a voice designed in words), then
  `pad, bos`; all but its last
  row are added to `tts_pad` rows ending with `tts_bos`;
- **non-streaming text** (the reference's default): the whole text then `tts_eos`,
  each plus `C(pad)`, then `tts_pad + C(bos)`; every generated frame gets `tts_pad`;
- **streaming text**: only the first text token (`T + C(bos)`) is in the prompt; the
  generated frames get the rest of the text, then `tts_eos`, then `tts_pad` — those
  rows are the request's conditioning;
- an instruction (`<|im_start|>user\\n{instructions}<|im_end|>\\n`, as `T` rows) comes
  first.

The prompt positions are placeholders (`codec_pad`), never sampled ids; the talker reads
only the embeddings. Bad requests are ValueErrors naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnistage.core.stage_input import StageInput, TokenBudget
from omnistage.families.qwen3_tts.text_rows import TalkerTextSide
from omnistage.voice_store import VoiceStore

ASSISTANT = "<|im_start|>assistant\n{}<|im_end|>\n<|im_start|>assistant\n"
INSTRUCTION = "<|im_start|>user\n{}<|im_end|>\n"
REFERENCE = "<|im_start|>assistant\n{}<|im_end|>\n"
"""A cloned voice's transcript (its ids are those between the role and `<|im_end|>\\n`)."""
_ROLE, _TAIL = 3, 5
"""Tokens of `<|im_start|>assistant\\n` before the text and of the template after it."""
MAX_TEXT_TOKENS = 4096


class Qwen3TTSPrompter:
    """Builds the talker's prompt and per-frame text rows for a request."""

    def __init__(
        self, config: Any, tokenizer: Any, text_side: TalkerTextSide, path: Path | None = None
    ) -> None:
        self.config = config
        self.path = path
        self.speaker_encoder: Any = None
        self.codec_encoder: Any = None
        self._references: dict[str, tuple[list[int], torch.Tensor]] = {}
        """Voice id -> its transcript's ids and its clip's codec codes (in-context cloning)."""
        self._clones: dict[str, torch.Tensor] = {}
        """Voice id -> its x-vector (voices are immutable: an id is never reused)."""
        self.talker = config.talker_config
        self.tokenizer = tokenizer
        self.side = text_side
        self.kind = config.tts_model_type or "custom_voice"
        bos, eos, pad = text_side.text(
            [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]
        )
        self.tts_bos, self.tts_eos, self.tts_pad = bos[None], eos[None], pad[None]

    @classmethod
    def from_checkpoint(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> Any:
        from omnistage.models.registry import auto_config_and_tokenizer

        path = Path(path)
        config, tokenizer = auto_config_and_tokenizer(path, "Qwen3-TTS")
        side = TalkerTextSide(path, config.talker_config, dtype)
        return cls(config, tokenizer, side, path)

    # -- the request ----------------------------------------------------------------------
    def request_input(self, stage: str, msg: Any) -> tuple[StageInput, TokenBudget | None]:
        """The talker's input for a request (`SubmitRequest`: prompt = the text, voice,
        instructions, language), and no token budget of its own."""
        text = msg.prompt
        if not isinstance(text, str) or not text.strip():
            raise ValueError("input: the text to speak is empty")
        speaker = self._speaker(msg.voice)
        instructions = self._instructions(msg.instructions)
        language = self._language(msg.language, speaker)
        # The reference's generate_voice_clone streams the text in; the others do not.
        stream_text = self.kind == "base"
        return self.build(text, speaker, language, instructions, stream_text), None

    def _speaker(self, voice: str | None) -> str | None:
        speakers = {k.lower(): k for k in self.talker.spk_id}
        if self.kind == "voice_design":
            if voice is not None:
                raise ValueError(
                    "voice: this Qwen3-TTS VoiceDesign checkpoint takes no voice; describe "
                    "the voice in `instructions`"
                )
            return None
        if VoiceStore.is_voice_id(voice):
            if self.kind != "base":
                raise ValueError(
                    f"voice: {voice!r} is an uploaded voice; cloning needs a Qwen3-TTS Base "
                    "checkpoint"
                )
            return voice
        if self.kind == "base":
            raise ValueError(
                "voice: this Qwen3-TTS Base checkpoint speaks in a cloned voice: upload a "
                "reference clip (POST /v1/audio/voices) and pass its id"
            )
        if voice is None:
            if not speakers:
                raise ValueError("voice: the checkpoint has no speakers")
            return next(iter(self.talker.spk_id))
        if voice.lower() not in speakers:
            raise ValueError(f"voice: {voice!r} is not one of {', '.join(sorted(speakers))}")
        return speakers[voice.lower()]

    def _instructions(self, instructions: str | None) -> str | None:
        if instructions is not None and not isinstance(instructions, str):
            raise ValueError(f"instructions: expected a string, got {instructions!r}")
        instructions = instructions or None
        if self.kind == "voice_design" and instructions is None:
            raise ValueError("instructions: a VoiceDesign checkpoint needs the voice described")
        small = (self.config.tts_model_size or "").lower() == "0b6"
        if instructions is not None and self.kind == "custom_voice" and small:
            raise ValueError("instructions: the 0.6B CustomVoice checkpoint takes none")
        return instructions

    def _language(self, language: str | None, speaker: str | None) -> int | None:
        """The codec language id (None: "auto"); a dialect speaker speaks their dialect."""
        languages = {k.lower(): v for k, v in self.talker.codec_language_id.items()}
        name = (language or "auto").lower()
        if name != "auto" and name not in languages:
            choices = ["auto", *sorted(k for k in languages if "dialect" not in k)]
            raise ValueError(f"language: {language!r} is not one of {', '.join(choices)}")
        dialects = {k.lower(): v for k, v in self.talker.spk_is_dialect.items()}
        dialect = dialects.get(speaker.lower()) if speaker else None
        if name in ("chinese", "auto") and dialect:
            return languages[str(dialect).lower()]
        return None if name == "auto" else languages[name]

    def _speaker_row(self, speaker: str) -> torch.Tensor:
        """A named speaker's codec embedding, or a cloned voice's x-vector (the speaker
        encoder's embedding of its reference clip, computed once per voice)."""
        if not VoiceStore.is_voice_id(speaker):
            return self.side.codec([self.talker.spk_id[speaker]])[0]
        if speaker not in self._clones:
            if self.speaker_encoder is None:
                from omnistage.families.qwen3_tts.speaker_encoder import SpeakerEncoder

                self.speaker_encoder = SpeakerEncoder.from_checkpoint(
                    self.path, self.config.speaker_encoder_config.to_dict(), self.side.dtype
                )
            clip = VoiceStore.for_model(self.path).audio(speaker)
            self._clones[speaker] = self.speaker_encoder.embed(clip).to(self.side.dtype)
        return self._clones[speaker]

    # -- the prompt -----------------------------------------------------------------------
    def _tokens(self, template: str, value: str) -> list[int]:
        ids = self.tokenizer(template.format(value), add_special_tokens=False)["input_ids"]
        return list(ids)

    @torch.inference_mode()
    def build(
        self,
        text: str,
        speaker: str | None,
        language_id: int | None,
        instructions: str | None = None,
        stream_text: bool = False,
    ) -> StageInput:
        """The talker's prompt embeddings and conditioning rows (module docstring)."""
        ids = self._tokens(ASSISTANT, text)
        body = ids[_ROLE:-_TAIL]
        if not body:
            raise ValueError("input: the text to speak is empty")
        if len(body) > MAX_TEXT_TOKENS:
            raise ValueError(f"input: {len(body)} tokens, over the limit of {MAX_TEXT_TOKENS}")
        t, side = self.talker, self.side
        if language_id is None:
            prefix = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
        else:
            prefix = [t.codec_think_id, t.codec_think_bos_id, language_id, t.codec_think_eos_id]
        codec = side.codec(prefix)
        if speaker is not None:
            codec = torch.cat([codec, self._speaker_row(speaker)[None]])
        codec = torch.cat([codec, side.codec([t.codec_pad_id, t.codec_bos_id])])
        pads = self.tts_pad.expand(codec.shape[0] - 2, -1)
        parts = [side.text(ids[:_ROLE]), torch.cat([pads, self.tts_bos]) + codec[:-1]]
        if instructions is not None:
            parts.insert(0, side.text(self._tokens(INSTRUCTION, instructions)))
        reference = self._reference(speaker)
        if reference is not None:
            tail, rows = self._in_context(body, *reference, stream_text)
            parts.append(tail)
        elif stream_text:
            parts.append(side.text(body[:1]) + codec[-1:])
            rows = torch.cat([side.text(body[1:]), self.tts_eos])
        else:
            text_rows = torch.cat([side.text(body), self.tts_eos])
            parts += [text_rows + side.codec([t.codec_pad_id]), self.tts_pad + codec[-1:]]
            rows = self.tts_pad
        embeds = torch.cat(parts)
        return StageInput(
            prompt_token_ids=[t.codec_pad_id] * embeds.shape[0],
            prompt_embeds=embeds,
            conditioning=rows,
            conditioning_fill=self.tts_pad[0],
            output_context=None if reference is None else reference[1],
        )

    def _reference(self, voice: str | None) -> tuple[list[int], torch.Tensor] | None:
        """An uploaded voice with a transcript: (its transcript's ids, its clip's codec
        codes), for in-context cloning; None otherwise (x-vector only, or no clone)."""
        if not VoiceStore.is_voice_id(voice):
            return None
        store = VoiceStore.for_model(self.path)
        record = store.get(voice)
        if record is None:
            raise ValueError(f"voice: no uploaded voice {voice!r}")
        if not record.get("text"):
            return None
        if voice not in self._references:
            if self.codec_encoder is None:
                from omnistage.families.qwen3_tts.reference_codes import ReferenceAudioEncoder

                self.codec_encoder = ReferenceAudioEncoder.from_checkpoint(self.path)
            ids = self._tokens(REFERENCE, record["text"])[_ROLE:-2]
            self._references[voice] = (ids, self.codec_encoder.encode(store.audio(voice)))
        return self._references[voice]

    def _in_context(
        self, body: list[int], ref_ids: list[int], ref_codes: torch.Tensor, stream_text: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The in-context part of a cloned voice's prompt (`generate_icl_prompt`): the
        reference transcript and the text, then `tts_eos`, beside `bos` and the reference
        clip's frames; and the conditioning rows of the generated frames."""
        t, side = self.talker, self.side
        text = torch.cat([side.text(ref_ids + body), self.tts_eos])
        codec = torch.cat([side.codec([t.codec_bos_id]), side.frames(ref_codes)])
        if not stream_text:
            pads = side.codec([t.codec_pad_id] * text.shape[0])
            return torch.cat([text + pads, codec + self.tts_pad]), self.tts_pad
        if text.shape[0] > codec.shape[0]:
            return text[: codec.shape[0]] + codec, text[codec.shape[0] :]
        padded = torch.cat([text, self.tts_pad.expand(codec.shape[0] - text.shape[0], -1)])
        return padded + codec, self.tts_pad
