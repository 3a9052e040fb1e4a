"""Qwen2.5-Omni's thinker and talker as parts of the real checkpoint, on our hot path.

Everything below was read from transformers 5.23
(`models/qwen2_5_omni/modeling_qwen2_5_omni.py`); the layout of the talker's
input (text and audio prompts), the greedy codes and the logits are checked
against it on the tiny checkpoint (`omnistage.families.qwen25_omni.tiny`, tests
`tests/models/test_qwen25_omni_{thinker,talker}.py`); the sampling defaults are
read from the code. Real-model numbers are
those of Qwen/Qwen2.5-Omni-7B (thinker hidden 3584, talker hidden 896).

**Thinker** (`Qwen25OmniThinker`, part `thinker`): a Qwen2 decoder (q/k/v with
bias, no q/k norm, dense SwiGLU). Text-only (and audio-only) prompts have equal
mrope rows, so it is ordinary RoPE, theta from `rope_parameters` (1e6), positions
0.. from the first token; `Qwen2_5OmniRotaryEmbedding` gives the same inverse
frequencies as Qwen2's. Image prompts (`omnistage.multimodal.Qwen25OmniInputEncoder`)
bring 3-D positions, rotated with non-interleaved mrope; videos are not supported.
`lm_head` is never tied to the embeddings: transformers ties it only when
`thinker_config.tie_word_embeddings` (default False) says so, whereas the
`text_config` we are given defaults that flag to True; a checkpoint without
`thinker.lm_head.weight` therefore fails loudly instead of silently using the
embeddings. As a pipeline stage it sends, per computed position, its input
embedding and its final *normed* hidden state side by side
(`hidden_output_layers = (0, num_layers)`), what the talker is built from.

**Talker** (`Qwen25OmniTalker`, part `talker`): a dense Qwen2 decoder over
`thinker_to_talker_proj(inputs)`, head `codec_head`, one codebook (vocab 8448).
In transformers the codec embedding `talker.model.embed_tokens` has the
*thinker's* width (`embedding_size`, 3584), codec and thinker rows are summed in
that width, and `Qwen2_5OmniTalkerForConditionalGeneration.forward` applies the
projection (Linear with bias, 3584 -> 896) to the sum, every step. This class
does the same: `forward(input_ids, positions, inputs_embeds)` takes
**thinker-width** rows (`prompt_embeds`, or `embed_input_ids(ids)` = the codec
embedding in thinker width, plus conditioning rows added by the runner) and
projects them itself. The engine's input-width checks therefore use
`input_width_for(config)` (`embedding_size`), not `hidden_size` (see the tests).

How transformers' `Qwen2_5OmniForConditionalGeneration.generate` feeds the talker
(P = prompt length, `out` = the thinker's n generated ids; the thinker ran with
`output_hidden_states=True`; per position `E` = its input embedding
`hidden_states[0]`, `Hn` = its final normed hidden `hidden_states[-1]`; rows
exist for the prompt and `out[:-1]` — the last generated token, normally
`<|im_end|>`, is never fed back and never reaches the talker):

- **Prompt** (P + 2 rows, all thinker width; `qwen25_talker_inputs`):
  rows `0..P-1`: `Hn + E` of each prompt token — the **whole prompt, system turn
  included** — with `E` zeroed at audio / image / video placeholder positions
  (only `Hn` there); row P: `embed_tokens_thinker(speaker bos_token)` (spk_dict;
  real Ethan 151870, Chelsie 151872 as vllm-omni hard-codes them; no `Hn`)
  `+ codec_embed(tts_codec_pad)`; row P+1: `Hn + E` of `out[0]` `+ codec_embed(tts_codec_start)`.
  transformers adds the two codec rows inside `talker.forward`, in place, only
  when it is given an `attention_mask` (`if attention_mask is not None and
  position_ids is None`); but 5.23's `GenerationMixin.generate` drops an all-ones
  mask before the first forward ("We can drop the mask altogether if it's all
  1s"), so an unpadded request (every batch of one) gets **no** codec rows there,
  while rows of a left-padded batch do. `qwen25_talker_inputs(codec_rows=True)`
  (the default) builds the prompt `talker.forward` builds whenever it gets a
  mask (what the code intends, and what padded batches get); `codec_rows=False`
  reproduces 5.23's unpadded `generate`.
- **Prompt ids** (`talker_input_ids`, only read by the repetition penalty):
  `[tts_codec_mask] * P + [tts_codec_pad, tts_codec_start]` (real 8296, 8292,
  8293). Positions: 0..P+1, decode steps continue with the cache length
  (ordinary RoPE, what the engine does). Given a mask, transformers computes them
  with `get_rope_index` on `[prompt ids, speaker bos, out[0]]`, which for text /
  audio prompts gives the same; without one (5.23, unpadded) the talker model's
  default `arange` — so images / videos get no 3-D talker positions there either.
  With images we follow the masked path (`qwen25_talker_inputs(image_grid_thw=...)`):
  the prompt's 3-D positions are `get_rope_index`'s over those ids (the image
  tokens take grid positions, the rest continues at the block's max + 1), and decode
  step s sits at `P + 2 + s + rope_delta` in all three rows (what the talker's
  `forward` computes from a mask at every step, as a padded batch's `generate`
  keeps it); rotated with non-interleaved mrope as the thinker's.
- **Decode step s** (s = 0 feeds back code 0, the talker's first sample):
  input = `codec_embed(code_s) + reply[s]` with
  `reply = [Hn + E of out[1] .. out[n-2], embed_tokens_thinker(tts_text_end)]`
  then `embed_tokens_thinker(tts_text_pad)` for every later step (real ids
  151861, 151859). In engine terms: conditioning row s = `reply[s]` for each
  output position s, then the fill row `tts_text_pad`. (Batched, transformers
  moves each row's `tts_text_end` right after its own thinker EOS; for one row
  that is this layout.) n = 1 crashes transformers (`torch.cat` of an empty
  list); `qwen25_talker_inputs` refuses it.
- **Sampling** (`talker.generate` kwargs): `do_sample=True, top_k=40, top_p=0.8,
  temperature=0.9, repetition_penalty=1.05` (over the prompt ids above and the
  generated codes: `tts_codec_pad`, an end id, is penalised from the start),
  `suppress_tokens=[tts_codec_start]` (done here in `compute_logits`),
  `eos_token_id=[8292, 8294]` = `[tts_codec_pad, tts_codec_end]` (the part's
  eos is `tts_codec_end`; give the request `stop_token_ids=[tts_codec_pad]` too),
  `max_new_tokens=4096`. Greedy (`talker_do_sample=False`) = argmax after the
  penalty and the suppression. Nothing else is suppressed: codes above the
  DiT's table (`dit_config.num_embeds` = 8193, real ids 8194..8447 but the end
  ids) can be sampled and then crash token2wav (its embedding has 8194 rows).
- **Codes for token2wav**: the generated ids up to (not including) the first end
  id, one codebook, `[T]`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.families.llama.model import Qwen2ForCausalLM
from omnistage.layers.linear import Embedding, Linear

DEFAULT_SPEAKER = "Chelsie"  # transformers' `generate(speaker="Chelsie")`
SPEAKER_FILE = "spk_dict.pt"


def _omni_rotary(config: Any) -> nn.Module:
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniRotaryEmbedding,
    )

    return Qwen2_5OmniRotaryEmbedding(config)


def mrope_section(config: Any) -> list[int]:
    """The thinker's `mrope_section` (T, H, W frequency counts): transformers 5 keeps it in
    the text config's `rope_parameters` (older `config.json` files say `rope_scaling`, which
    it reads into `rope_parameters`); `Qwen2_5OmniRotaryEmbedding`'s default otherwise."""
    for attr in ("rope_parameters", "rope_scaling"):
        rope = getattr(config, attr, None)
        if isinstance(rope, dict) and rope.get("mrope_section") is not None:
            return [int(n) for n in rope["mrope_section"]]
    return [16, 24, 24]


class Qwen25OmniThinker(Qwen2ForCausalLM):
    """Qwen2.5-Omni's thinker text decoder (part `thinker`); see the module docstring.

    Requests with images bring 3-D positions (`Qwen25OmniInputEncoder`), rotated with
    **non-interleaved** multimodal RoPE: the first `mrope_section[0]` rotary frequencies
    take the T row, the next `mrope_section[1]` H, the rest W
    (`Qwen2_5OmniRotaryEmbedding.recomposition_frequencies`). Text and audio prompts keep
    the plain 1-D path. No deepstack."""

    architectures = ("OmnistageQwen25OmniThinker",)
    supports_mrope = True

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        config = copy.copy(config)
        config.tie_word_embeddings = False
        super().__init__(config, dtype, max_positions)
        self.hidden_output_layers = (0, config.num_hidden_layers)
        section = mrope_section(config)
        half = self.head_dim // 2
        if len(section) != 3 or sum(section) != half:
            raise ValueError(
                f"rope_parameters: mrope_section {section} must be 3 numbers summing to "
                f"head_dim / 2 = {half}"
            )
        self.layers[0].self_attn.rotary.enable_mrope(section, interleaved=False)

    @staticmethod
    def _hf_rotary(config: Any) -> nn.Module:
        return _omni_rotary(config)


class Qwen25OmniTalker(Qwen2ForCausalLM):
    """Qwen2.5-Omni's talker decoder (part `talker`): inputs in the thinker's width,
    projected by `thinker_to_talker_proj`, a dense Qwen2 decoder, `codec_head`.

    Prompts from image questions come with 3-D positions (`qwen25_talker_inputs`),
    rotated with **non-interleaved** mrope (`Qwen2_5OmniRotaryEmbedding`, the talker
    config's `mrope_section`); text and audio prompts keep the plain 1-D path."""

    architectures = ("OmnistageQwen25OmniTalker",)
    supports_mrope = True

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        config = copy.copy(config)
        config.tie_word_embeddings = False  # the codec table is wider than the head's input
        super().__init__(config, dtype, max_positions)
        section = mrope_section(config)
        half = self.head_dim // 2
        if len(section) != 3 or sum(section) != half:
            raise ValueError(
                f"rope_parameters: mrope_section {section} must be 3 numbers summing to "
                f"head_dim / 2 = {half}"
            )
        self.layers[0].self_attn.rotary.enable_mrope(section, interleaved=False)
        self.embed_tokens = Embedding(config.vocab_size, self.input_width, dtype=dtype)
        self.thinker_to_talker_proj = Linear(self.input_width, config.hidden_size, True, dtype)
        self.codec_start_token_id = int(config.tts_codec_start_token_id)

    @classmethod
    def input_width_for(cls, config: Any) -> int:
        """Width of `inputs_embeds` / `embed_input_ids` rows: the thinker's hidden size."""
        return int(config.embedding_size)

    @staticmethod
    def _hf_rotary(config: Any) -> nn.Module:
        return _omni_rotary(config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        return super().forward(input_ids, positions, self.thinker_to_talker_proj(x))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Codec logits, `tts_codec_start` suppressed (`generate`'s `suppress_tokens`)."""
        logits = super().compute_logits(hidden)
        logits[:, self.codec_start_token_id] = float("-inf")
        return logits


# -- the talker's input, from the thinker's output ---------------------------------------------
@dataclass(frozen=True)
class Qwen25TalkerSpecials:
    """The fixed rows and ids the talker's input is assembled from (thinker width)."""

    speaker_bos: dict[str, torch.Tensor]
    """Per speaker: the thinker embedding of its `bos_token` (spk_dict.pt) [H]."""
    text_end: torch.Tensor
    """Thinker embedding of `tts_text_end_token_id` [H]."""
    text_pad: torch.Tensor
    """Thinker embedding of `tts_text_pad_token_id` [H]."""
    codec_pad: torch.Tensor
    """Talker codec embedding of `tts_codec_pad_token_id` [H]."""
    codec_start: torch.Tensor
    """Talker codec embedding of `tts_codec_start_token_id` [H]."""
    codec_mask_id: int
    codec_pad_id: int
    codec_start_id: int
    media_ids: tuple[int, ...]
    """Audio, image and video placeholder ids (their input embeddings are zeroed)."""
    image_token_id: int = -1
    """The talker config's image placeholder id (`get_rope_index`'s image tokens)."""
    spatial_merge_size: int = 2
    position_id_per_seconds: float = 25

    @classmethod
    def from_checkpoint(cls, path: str | Path, dtype: torch.dtype) -> Qwen25TalkerSpecials:
        from safetensors import safe_open
        from transformers import AutoConfig

        path = Path(path)
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        talker, thinker = config.talker_config, config.thinker_config
        speakers = torch.load(path / SPEAKER_FILE, weights_only=True)
        wanted = {
            "thinker.model.embed_tokens.weight": None,
            "talker.model.embed_tokens.weight": None,
        }
        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    if key in wanted:
                        wanted[key] = f.get_tensor(key)
        thinker_embed = wanted["thinker.model.embed_tokens.weight"]
        codec_embed = wanted["talker.model.embed_tokens.weight"]
        if thinker_embed is None or codec_embed is None:
            raise ValueError(f"{path}: thinker or talker embeddings missing from the checkpoint")
        thinker_embed, codec_embed = thinker_embed.to(dtype), codec_embed.to(dtype)
        return cls(
            speaker_bos={
                name: thinker_embed[int(spk["bos_token"])] for name, spk in speakers.items()
            },
            text_end=thinker_embed[talker.tts_text_end_token_id],
            text_pad=thinker_embed[talker.tts_text_pad_token_id],
            codec_pad=codec_embed[talker.tts_codec_pad_token_id],
            codec_start=codec_embed[talker.tts_codec_start_token_id],
            codec_mask_id=int(talker.tts_codec_mask_token_id),
            codec_pad_id=int(talker.tts_codec_pad_token_id),
            codec_start_id=int(talker.tts_codec_start_token_id),
            media_ids=(
                int(thinker.audio_token_index),
                int(thinker.image_token_index),
                int(thinker.video_token_index),
            ),
            image_token_id=int(talker.image_token_index),
            spatial_merge_size=int(talker.spatial_merge_size),
            position_id_per_seconds=talker.position_id_per_seconds,
        )


@dataclass(frozen=True)
class Qwen25TalkerInput:
    """A talker request: prompt ids (for the repetition penalty), prompt embeddings
    [P + 2, H], then one conditioning row per output position (`conditioning[s]` is added
    to the embedding of fed-back code s) and the row every later position gets (`fill`);
    for a prompt with images, its 3-D positions and rope delta (`mm_decoder_inputs`;
    None: ordinary positions)."""

    prompt_token_ids: list[int]
    prompt_embeds: torch.Tensor
    conditioning: torch.Tensor
    fill: torch.Tensor
    mm_decoder_inputs: MultimodalDecoderInputs | None = None

    def step_row(self, step: int) -> torch.Tensor:
        """What transformers adds to `codec_embed(code_step)` at decode step `step`."""
        return self.conditioning[step] if step < self.conditioning.shape[0] else self.fill


def qwen25_talker_inputs(
    thinker_embeds: torch.Tensor,
    thinker_hidden: torch.Tensor,
    prompt_ids: list[int],
    output_ids: list[int],
    specials: Qwen25TalkerSpecials,
    speaker: str = DEFAULT_SPEAKER,
    codec_rows: bool = True,
    image_grid_thw: torch.Tensor | None = None,
) -> Qwen25TalkerInput:
    """The talker's input as `Qwen2_5OmniForConditionalGeneration.generate` builds it.

    `thinker_embeds` / `thinker_hidden`: [P + n - 1 (or more), H] per thinker position
    (prompt, then every output but the last): its input embedding (`hidden_states[0]`)
    and final normed hidden state (`hidden_states[-1]`). Rows past `P + n - 1` are
    ignored. `codec_rows=False` leaves out the `tts_codec_pad` / `tts_codec_start`
    embeddings of the last two prompt rows, as transformers 5.23's `generate` does for
    an unpadded request. `image_grid_thw` [images, 3]: the patch grids of the prompt's
    images, in order (then the prompt gets 3-D positions). See the module docstring for
    the layout."""
    if speaker not in specials.speaker_bos:
        known = ", ".join(sorted(specials.speaker_bos))
        raise ValueError(f"speaker: {speaker!r} is not one of {known}")
    p, n = len(prompt_ids), len(output_ids)
    if n < 2:
        raise ValueError(
            "the thinker generated no text to speak (the talker needs at least one token "
            "before the thinker's end token)"
        )
    rows = p + n - 1
    if thinker_embeds.shape[0] < rows or thinker_hidden.shape[0] < rows:
        raise ValueError(
            f"thinker rows: expected {rows} (prompt {p} + outputs {n} - 1), got "
            f"{thinker_embeds.shape[0]} embeddings and {thinker_hidden.shape[0]} hidden states"
        )
    embeds = thinker_embeds[:rows].clone()
    media = torch.isin(torch.tensor(prompt_ids), torch.tensor(specials.media_ids))
    embeds[:p][media.to(embeds.device)] = 0
    summed = thinker_hidden[:rows].to(embeds.dtype) + embeds
    dtype, device = summed.dtype, summed.device

    def row(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, dtype)

    speaker_row, first_row = row(specials.speaker_bos[speaker]), summed[p]
    if codec_rows:
        speaker_row = speaker_row + row(specials.codec_pad)
        first_row = first_row + row(specials.codec_start)
    prompt_embeds = torch.cat([summed[:p], speaker_row[None], first_row[None]])
    conditioning = torch.cat([summed[p + 1 :], row(specials.text_end)[None]])
    return Qwen25TalkerInput(
        prompt_token_ids=[specials.codec_mask_id] * p
        + [specials.codec_pad_id, specials.codec_start_id],
        prompt_embeds=prompt_embeds,
        conditioning=conditioning,
        fill=row(specials.text_pad),
        mm_decoder_inputs=_talker_positions(prompt_ids, specials, image_grid_thw),
    )


def _talker_positions(
    prompt_ids: list[int], specials: Qwen25TalkerSpecials, image_grid_thw: torch.Tensor | None
) -> MultimodalDecoderInputs | None:
    """The talker prompt's 3-D positions, as `Qwen2_5OmniTalkerForConditionalGeneration.forward`
    computes them given a mask (`get_rope_index` over `[prompt ids, speaker bos, out[0]]`),
    or None where they are the ordinary ones (no image in the prompt)."""
    if image_grid_thw is None or len(image_grid_thw) == 0:
        return None
    from omnistage.multimodal.mrope import mrope_positions

    grids = torch.as_tensor(image_grid_thw, dtype=torch.long).reshape(-1, 3)
    # The speaker bos and out[0] are text to `get_rope_index` (it pairs grids only with the
    # image tokens after a vision start, all in the prompt): 2 non-image ids stand for them.
    ids = torch.tensor([*prompt_ids, -1, -1], dtype=torch.long)
    positions, delta = mrope_positions(
        ids,
        grids,
        image_token_id=specials.image_token_id,
        spatial_merge_size=specials.spatial_merge_size,
        position_id_per_seconds=specials.position_id_per_seconds,
    )
    return MultimodalDecoderInputs(mrope_positions=positions, rope_delta=int(delta))
