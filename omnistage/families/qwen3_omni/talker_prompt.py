"""Qwen3-Omni's talker input, built from the thinker's output in the talker stage.

`Qwen3OmniTalkerPrompter` holds the talker checkpoint's input projections (read
from the one checkpoint, apart from the talker model the runner holds) and builds,
as transformers' `generate` does (docs/qwen3_omni_reference.md §3): the talker's
prompt, one projected thinker text row per frame (then `tts_eos`, then `tts_pad`),
and for image questions the talker's 3-D positions. It takes the thinker's rows
whole or streamed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.layers.linear import Embedding, Linear


class ResizeMLP(nn.Module):
    """`Qwen3OmniMoeTalkerResizeMLP`: thinker width -> talker width."""

    def __init__(self, inner: int, outer: int, inter: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.linear_fc1 = Linear(inner, inter, True, dtype=dtype)
        self.linear_fc2 = Linear(inter, outer, True, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


def load_part_tensors(path: Path, names: dict[str, str]) -> dict[str, torch.Tensor]:
    """The checkpoint tensors whose names start with a key of `names`, renamed to its value
    (read lazily: only those tensors are loaded)."""
    from omnistage.models.loader import iter_weights

    out: dict[str, torch.Tensor] = {}
    for key, tensor in iter_weights(Path(path), list(names)):
        prefix = next(p for p in names if key.startswith(p))
        out[names[prefix] + key[len(prefix) :]] = tensor
    return out


class TalkerInput:
    """What the talker stage starts a request from: prompt ids (placeholders), prompt
    embeddings, one conditioning row per generated frame so far, and — once the thinker
    has finished — the row of every frame after those (else None: more rows will come);
    for a prompt with images, its 3-D positions and rope delta (`mm_decoder_inputs`; None:
    ordinary positions)."""

    def __init__(
        self,
        prompt_token_ids: list[int],
        prompt_embeds: torch.Tensor,
        conditioning: torch.Tensor,
        fill: torch.Tensor | None,
        mm_decoder_inputs: MultimodalDecoderInputs | None = None,
    ) -> None:
        self.prompt_token_ids = prompt_token_ids
        self.prompt_embeds = prompt_embeds
        self.conditioning = conditioning
        self.fill = fill
        self.mm_decoder_inputs = mm_decoder_inputs


class Qwen3OmniTalkerPrompter(nn.Module):
    """Builds the talker's input from the thinker's output, as transformers' `generate`
    does (docs/qwen3_omni_reference.md §3): the user turns (text tokens through
    `text_projection` of their embeddings, audio / image / video placeholders through
    `hidden_projection` of the thinker's `accept_hidden_layer` output), then 9 assistant
    positions mixing text and codec control embeddings, and per generated frame one
    projected text row of the thinker's reply (`tts_eos`, then `tts_pad` after it).

    Positions (§3): ordinary without images; with the prompt's image grids, the 3-D
    positions `get_rope_index` gives the talker's own input ids (the user part's ids,
    then `tts_pad` for the 9 assistant positions) and, for every later frame, the
    sequence index plus its rope delta."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        talker = config.talker_config
        thinker_hidden = talker.thinker_hidden_size
        inter, hidden = talker.text_config.intermediate_size, talker.text_config.hidden_size
        self.text_projection = ResizeMLP(thinker_hidden, hidden, inter, dtype)
        self.hidden_projection = ResizeMLP(thinker_hidden, hidden, inter, dtype)
        self.codec_embedding = Embedding(talker.text_config.vocab_size, hidden, dtype=dtype)
        self.register_buffer("tts_rows", torch.zeros(3, thinker_hidden, dtype=dtype))
        self.requires_grad_(False)
        self.dtype = dtype
        self.config = config
        thinker = config.thinker_config
        self.multimodal_ids = torch.tensor(
            [thinker.audio_token_id, thinker.image_token_id, thinker.video_token_id]
        )
        self.placeholder_id = talker.codec_pad_id

    @classmethod
    def from_checkpoint(cls, path: str | Path, dtype: torch.dtype) -> Qwen3OmniTalkerPrompter:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path, local_files_only=True)
        prompter = cls(config, dtype)
        tensors = load_part_tensors(
            Path(path),
            {
                "talker.text_projection.": "text_projection.",
                "talker.hidden_projection.": "hidden_projection.",
                "talker.model.codec_embedding.": "codec_embedding.",
                "thinker.model.embed_tokens.weight": "thinker_embed",
            },
        )
        thinker_embed = tensors.pop("thinker_embed", None)
        if thinker_embed is None:
            raise ValueError(f"{path}: no thinker.model.embed_tokens.weight in the checkpoint")
        ids = [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]
        tensors["tts_rows"] = thinker_embed[ids]
        missing, unexpected = prompter.load_state_dict(
            {k: v.to(dtype) for k, v in tensors.items()}, strict=False
        )
        if missing or unexpected:
            raise ValueError(f"{path}: talker projections do not match ({missing or unexpected})")
        return prompter

    @torch.inference_mode()
    def build(
        self,
        prompt_ids: list[int],
        output_ids: list[int],
        thinker_rows: torch.Tensor,
        speaker: str = "ethan",
        finished: bool = True,
        image_grid_thw: torch.Tensor | None = None,
    ) -> TalkerInput:
        """`thinker_rows` [positions, 2 * thinker hidden]: per position the thinker computed
        (prompt, then every output but the last), its input embedding and its
        `accept_hidden_layer` output (`Qwen3OmniThinker.hidden_output_layers`).
        `image_grid_thw` [images, 3]: the patch grids of the prompt's images, in order.

        Streamed (`finished=False`), the rows so far must reach the first generated token
        (the talker's last prompt position); `text_rows` turns later rows into more
        conditioning rows."""
        cfg, talker = self.config, self.config.talker_config
        speakers = {k.lower(): v for k, v in talker.speaker_id.items()}
        if speaker.lower() not in speakers:
            raise ValueError(f"speaker: {speaker!r} is not one of {', '.join(sorted(speakers))}")
        rows = thinker_rows.to(self.dtype)
        width = rows.shape[1] // 2
        embeds, hidden = rows[:, :width], rows[:, width:]
        n = rows.shape[0]
        seq = torch.tensor((prompt_ids + output_ids)[:n], dtype=torch.long)
        prompt = torch.tensor(prompt_ids, dtype=torch.long)
        user, user_rows = self._user_rows(prompt, seq, embeds, hidden)
        # Assistant part, from the last <|im_start|>assistant of the prompt.
        opens = (prompt[:-1] == cfg.im_start_token_id) & (prompt[1:] == cfg.assistant_token_id)
        if not opens.any():
            raise ValueError("the thinker prompt has no '<|im_start|>assistant' turn to speak")
        start = int(opens.nonzero().flatten()[-1])
        reply = self.text_projection(embeds[start:])
        if reply.shape[0] < 4:
            raise ValueError(
                "the thinker generated no text to speak"
                if finished
                else "a streamed first chunk must reach the thinker's first generated token"
            )
        tts_bos, tts_eos, tts_pad = self.text_projection(self.tts_rows)
        text_side = torch.cat([reply[:3], tts_pad.expand(4, -1), tts_bos[None], reply[3:4]], dim=0)
        codec_ids = torch.tensor(
            [
                talker.codec_nothink_id,
                talker.codec_think_bos_id,
                talker.codec_think_eos_id,
                speakers[speaker.lower()],
                talker.codec_pad_id,
                talker.codec_bos_id,
            ]
        )
        codec_side = torch.cat(
            [torch.zeros(3, text_side.shape[1], dtype=self.dtype), self.codec_embedding(codec_ids)]
        )
        prompt_embeds = torch.cat([user_rows, text_side + codec_side])
        rows, fill = self._with_end(reply[4:], finished)
        return TalkerInput(
            prompt_token_ids=[self.placeholder_id] * prompt_embeds.shape[0],
            prompt_embeds=prompt_embeds,
            conditioning=rows,
            fill=fill,
            mm_decoder_inputs=self._positions(prompt, user, text_side.shape[0], image_grid_thw),
        )

    def _user_rows(
        self, prompt: torch.Tensor, seq: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The user part: every prompt position whose latest <|im_start|> opens a user turn,
        and its rows (text projected; audio / image positions from the hidden states)."""
        cfg = self.config
        positions = torch.arange(prompt.shape[0])
        starts = torch.where(prompt == cfg.im_start_token_id, positions, -1)
        previous = torch.cummax(starts, dim=0).values.clamp_min(0)
        role = prompt[(previous + 1).clamp_max(prompt.shape[0] - 1)]
        user = (role == cfg.user_token_id).nonzero().flatten()
        multimodal = torch.isin(seq[user], self.multimodal_ids)
        user_rows = self.text_projection(embeds[user])
        if multimodal.any():
            user_rows[multimodal] = self.hidden_projection(hidden[user[multimodal]])
        return user, user_rows

    def _positions(
        self,
        prompt: torch.Tensor,
        user: torch.Tensor,
        num_assistant: int,
        image_grid_thw: torch.Tensor | None,
    ) -> MultimodalDecoderInputs | None:
        """The talker prompt's 3-D positions (`get_rope_index` over the talker's input ids,
        `Qwen3OmniMoeTalkerForConditionalGeneration._prepare_position_ids_for_generation`),
        or None where they are the ordinary ones (no image in the user turns)."""
        if image_grid_thw is None or len(image_grid_thw) == 0:
            return None
        from omnistage.families.qwen3_omni.input_encoder import mrope_positions

        cfg, talker = self.config, self.config.talker_config
        image_id = talker.image_token_id
        grids = torch.as_tensor(image_grid_thw, dtype=torch.long).reshape(-1, 3)
        # Image k of the prompt is its k-th run of image tokens; the talker sees only the
        # images of user turns (transformers pairs the grids with the images it sees in
        # order, which is the same when every image is in a user turn, as chats put them).
        is_image = prompt == image_id
        run_starts = is_image & torch.cat([torch.tensor([True]), ~is_image[:-1]])
        if int(run_starts.sum()) != grids.shape[0]:
            raise ValueError(
                f"image_grid_thw: {grids.shape[0]} grid(s) for {int(run_starts.sum())} image(s) "
                "in the thinker prompt"
            )
        in_user = torch.zeros_like(is_image)
        in_user[user] = True
        grids = grids[in_user[run_starts]]
        if grids.shape[0] == 0:
            return None
        ids = torch.cat([prompt[user], torch.full((num_assistant,), cfg.tts_pad_token_id)])
        positions, delta = mrope_positions(
            ids,
            grids,
            image_token_id=image_id,
            spatial_merge_size=talker.spatial_merge_size,
            position_id_per_seconds=talker.position_id_per_seconds,
        )
        return MultimodalDecoderInputs(mrope_positions=positions, rope_delta=int(delta))

    @torch.inference_mode()
    def text_rows(
        self, thinker_rows: torch.Tensor, finished: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A later streamed chunk of thinker rows -> the talker's conditioning rows (one per
        frame), then, when the thinker has finished, `tts_eos` and the `tts_pad` fill."""
        width = thinker_rows.shape[1] // 2 if thinker_rows.ndim == 2 else 0
        embeds = thinker_rows.to(self.dtype)[:, :width] if width else None
        rows = (
            self.text_projection(embeds)
            if embeds is not None and embeds.shape[0]
            else torch.zeros(0, self.codec_embedding.embedding_dim, dtype=self.dtype)
        )
        return self._with_end(rows, finished)

    def _with_end(
        self, rows: torch.Tensor, finished: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not finished:
            return rows, None
        _, tts_eos, tts_pad = self.text_projection(self.tts_rows)
        return torch.cat([rows, tts_eos[None]]), tts_pad
