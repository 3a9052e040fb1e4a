"""The Ming-Omni talker's input, built from the thinker's output (the thinker -> talker edge).

What the reference (`BailingTalkerForConditionalGeneration.omni_tts_binary_generation`
and `generate`, inclusionAI/Ming `modeling_bailing_talker.py`; `test_talker.py` for how
the thinker's output is handed over) feeds its talker, with `tok` the talker tokenizer,
T the thinker prompt's length, `text = tok.encode(reply)` where `reply` is the thinker's
generated ids decoded by the thinker tokenizer with special tokens skipped:

- speech ids: `<prompt> </prompt> <thinker_prefix> <audio_pad>*T </thinker_prefix> <vp>
  <audio_pad> </vp> <audio_bos>`; text ids: the same but the last is `text[0]`; each
  position's input is the sum of the two ids' embeddings;
- then positions 3 .. 3+T-1 are *replaced* by `thinker_to_talker_proj(E + Hn)` of the
  thinker's prompt positions (E its input embedding, Hn its final normed hidden state:
  `hidden_states[0][0] + hidden_states[0][-1]` of the thinker's first step), and the
  `<audio_pad>` inside `<vp> </vp>` by `vp_head(speaker embedding)` (a Conv1d over the
  192-d speaker vector);
- decode step s feeds back sampled speech id s plus the embedding of text id
  `rest[s]`, `rest = text[1:] + [<text_eos>]`, then `<text_pad>` at every later step.

Positions: see `talker.py` (the whole prompt at `P - 1`, step s at `P + s`).
Speakers: `talker/spks/<name>.pt`, each a `[1, 192]` speaker embedding (the reference
repository's `data/spks/luna.pt` is one); the default is "luna".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from omnistage.core.multimodal_inputs import MultimodalDecoderInputs

SPEAKERS_DIR = "talker/spks"
DEFAULT_SPEAKER = "luna"
_WEIGHTS = {
    "embed": "talker.model.model.embed_tokens.weight",
    "proj_w": "talker.thinker_to_talker_proj.weight",
    "proj_b": "talker.thinker_to_talker_proj.bias",
    "vp_w": "talker.vp_head.weight",
    "vp_b": "talker.vp_head.bias",
}
_SPECIALS = (
    "<prompt>",
    "</prompt>",
    "<thinker_prefix>",
    "</thinker_prefix>",
    "<audio_pad>",
    "<vp>",
    "</vp>",
    "<audio_bos>",
    "<text_eos>",
    "<text_pad>",
)


def speaker_names(path: str | Path) -> list[str]:
    """The speakers a checkpoint ships (`talker/spks/*.pt`), sorted."""
    return sorted(p.stem for p in (Path(path) / SPEAKERS_DIR).glob("*.pt"))


def read_tensors(path: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The named tensors of the checkpoint's safetensors (ValueError naming a missing one)."""
    from safetensors import safe_open

    found: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if key in names:
                    found[key] = f.get_tensor(key)
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"{path}: checkpoint tensors missing: {', '.join(missing)}")
    return found


@dataclass(frozen=True)
class MingTalkerInput:
    """A talker request: prompt (speech) ids, prompt embeddings [P, H], one conditioning row
    per output position, the row of every later position (`fill`), and its positions."""

    prompt_token_ids: list[int]
    prompt_embeds: torch.Tensor
    conditioning: torch.Tensor
    fill: torch.Tensor
    mm_decoder_inputs: MultimodalDecoderInputs


class MingTalkerPrompter:
    """Builds `MingTalkerInput`s with one checkpoint's tokenizers, talker embeddings,
    `thinker_to_talker_proj`, `vp_head` and speakers."""

    def __init__(
        self, thinker_tok: Any, talker_tok: Any, tensors: dict[str, torch.Tensor], speakers: dict
    ) -> None:
        self.thinker_tok = thinker_tok
        self.talker_tok = talker_tok
        self.embed = tensors["embed"]
        self.proj_w, self.proj_b = tensors["proj_w"], tensors["proj_b"]
        self.vp_w, self.vp_b = tensors["vp_w"], tensors["vp_b"]
        self.speakers = speakers
        self.ids = {s: self._special_id(s) for s in _SPECIALS}

    @classmethod
    def from_checkpoint(cls, path: str | Path, dtype: torch.dtype) -> MingTalkerPrompter:
        from transformers import AutoTokenizer

        path = Path(path)
        thinker_tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        talker_tok = AutoTokenizer.from_pretrained(path / "talker", local_files_only=True)
        raw = read_tensors(path, list(_WEIGHTS.values()))
        tensors = {k: raw[v].to(dtype) for k, v in _WEIGHTS.items()}
        speakers = {
            name: torch.load(path / SPEAKERS_DIR / f"{name}.pt", weights_only=True).to(dtype)
            for name in speaker_names(path)
        }
        return cls(thinker_tok, talker_tok, tensors, speakers)

    def _special_id(self, token: str) -> int:
        ids = self.talker_tok.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"talker tokenizer: {token!r} is not one special token ({ids})")
        return int(ids[0])

    def reply_text_ids(self, output_ids: list[int]) -> list[int]:
        """The talker tokenizer's ids of the thinker's reply (decoded without specials)."""
        reply = self.thinker_tok.decode(output_ids, skip_special_tokens=True)
        return list(self.talker_tok.encode(reply, add_special_tokens=False))

    def speaker_row(self, speaker: str) -> torch.Tensor:
        if speaker not in self.speakers:
            known = ", ".join(sorted(self.speakers)) or "none"
            raise ValueError(f"voice: {speaker!r} is not one of this talker's speakers ({known})")
        vp = self.speakers[speaker].reshape(1, -1, self.vp_w.shape[1]).transpose(1, 2)
        out = F.conv1d(vp, self.vp_w, self.vp_b, padding=self.vp_w.shape[-1] // 2)
        return out.transpose(1, 2)[0, 0]

    def build(
        self,
        prompt_len: int,
        output_ids: list[int],
        rows: torch.Tensor,
        speaker: str = DEFAULT_SPEAKER,
    ) -> MingTalkerInput:
        """The talker input for a thinker prompt of `prompt_len` positions whose generated
        ids are `output_ids`; `rows` [positions, 2 H]: per thinker position its input
        embedding and final normed hidden state, side by side (the prompt's come first)."""
        text = self.reply_text_ids(output_ids)
        if not text:
            raise ValueError("the thinker generated no text to speak")
        if rows.ndim != 2 or rows.shape[1] % 2 or rows.shape[0] < prompt_len:
            raise ValueError(
                f"thinker rows: expected [>= {prompt_len}, 2 x hidden], got {list(rows.shape)}"
            )
        width = rows.shape[1] // 2
        thinker = rows[:prompt_len, :width] + rows[:prompt_len, width:]
        return self.talker_input(text, thinker, speaker)

    def talker_input(
        self, text: list[int], thinker: torch.Tensor | None, speaker: str
    ) -> MingTalkerInput:
        """The talker input for talker-tokenizer `text` ids, the thinker's prompt rows
        [T, H] (`E + Hn`; None: none, the reference's `thinker_reply_part=None`, T = 0)."""
        i = self.ids
        n = 0 if thinker is None else thinker.shape[0]
        head = [i["<prompt>"], i["</prompt>"], i["<thinker_prefix>"]]
        head += [i["<audio_pad>"]] * n + [i["</thinker_prefix>"]]
        head += [i["<vp>"], i["<audio_pad>"], i["</vp>"]]
        speech, text_ids = head + [i["<audio_bos>"]], head + text[:1]
        embed = self.embed
        dtype = embed.dtype
        prompt = embed[torch.tensor(speech)] + embed[torch.tensor(text_ids)]
        if thinker is not None:
            prompt[3 : 3 + n] = F.linear(thinker.to(dtype), self.proj_w, self.proj_b)
        prompt[len(head) - 2] = self.speaker_row(speaker)
        rest = text[1:] + [i["<text_eos>"]]
        p = len(speech)
        positions = torch.full((3, p), p - 1, dtype=torch.long)
        return MingTalkerInput(
            prompt_token_ids=speech,
            prompt_embeds=prompt,
            conditioning=embed[torch.tensor(rest)],
            fill=embed[i["<text_pad>"]],
            mm_decoder_inputs=MultimodalDecoderInputs(mrope_positions=positions, rope_delta=0),
        )
