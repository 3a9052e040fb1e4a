"""Qwen3-Omni's thinker and talker as parts of the real checkpoint, on our hot path.

The **thinker** is the MoE text decoder; as a pipeline stage it also sends the
talker what transformers' `generate` hands it: per computed position, the input
embedding (`hidden_states[0]`) and the output of layer `accept_hidden_layer`,
side by side in one row (`hidden_output_layers`).

The **talker** generates one frame of speech codes per step
(docs/qwen3_omni_reference.md §3-4):

- its decoder (MoE + gated shared expert per layer) samples the frame's first
  code from `codec_head`, with the top 1024 ids but `codec_eos` suppressed;
- the code predictor (a small dense decoder with a fresh cache per frame) then
  writes the other `num_code_groups - 1` codes, from the decoder's final hidden
  state and the first code's embedding; both happen in `sample()`, so the
  runner keeps all codes of each frame in the request's history
  (`num_token_codes`);
- a frame fed back is embedded as the sum of its codes' embeddings
  (`embed_token_codes`), plus one projected thinker text row per step, which
  arrives as a conditioning row (see `Qwen3OmniTalkerPrompter`).

Sampling is seeded per request and output position, as the default sampler's:
the first code with the request's parameters (temperature 0 = greedy), the
code predictor's codes greedy for greedy requests, else with top-k 50, top-p
0.8, temperature 1 (transformers' defaults for it).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.models.base import DeepstackRows
from omnistage.models.layers import RMSNorm, RotaryEmbedding, _rotate
from omnistage.models.moe import Qwen3MoeForCausalLM, Qwen3OmniTalkerDecoder
from omnistage.models.parts import ROOT_CONFIG_ATTR
from omnistage.sample import Sampler, SamplingMetadata
from omnistage.sample.metadata import SAMPLING_EPS, RowSamplingState
from omnistage.sampling_params import SamplingParams

NUM_SUPPRESSED = 1024
"""The top ids of the talker vocabulary `generate` never samples (but `codec_eos`)."""

_CODE_PREDICTOR_PARAMS = SamplingParams(temperature=1.0, top_k=50, top_p=0.8)
_GREEDY = SamplingParams(temperature=0.0)
_SEED_SALT = 0x636F64655F707265  # separates the code predictor's draws from the talker's


def root_config(config: Any) -> Any:
    root = getattr(config, ROOT_CONFIG_ATTR, None)
    if root is None:
        raise ValueError(
            f"{type(config).__name__}: a Qwen3-Omni part needs the whole checkpoint's config "
            "(load it with model_part=...)"
        )
    return root


class Qwen3OmniThinker(Qwen3MoeForCausalLM):
    """The thinker's text decoder. Requests with images bring 3-D positions, rotated with
    interleaved multimodal RoPE (`mrope_section` of the text config's `rope_parameters`),
    and deepstack features, added after the first decoder layers at their visual rows
    (`Qwen3OmniMoeThinkerTextModel._deepstack_process`); the hidden states sent to the
    talker are taken before that addition, as transformers records them."""

    architectures = ("OmnistageQwen3OmniThinker",)
    supports_mrope = True
    supports_deepstack = True

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, dtype, max_positions)
        accept = root_config(config).talker_config.accept_hidden_layer
        self.hidden_output_layers = (0, accept)
        rope = getattr(config, "rope_parameters", None) or {}
        section = list(rope.get("mrope_section", [24, 20, 20]))  # transformers' default
        self.layers[0].self_attn.rotary.enable_mrope(section, interleaved=True)

    @staticmethod
    def _hf_rotary(config: Any) -> nn.Module:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeThinkerTextRotaryEmbedding,
        )

        return Qwen3OmniMoeThinkerTextRotaryEmbedding(config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
        deepstack: DeepstackRows | None = None,
    ) -> torch.Tensor:
        if deepstack is None:
            return super().forward(input_ids, positions, inputs_embeds)
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        wanted, captured = self.hidden_output_layers, {}
        num_layers = len(self.layers)
        if 0 in wanted:
            captured[0] = x
        for i, layer in enumerate(self.layers):
            x = layer(positions, x)
            if i + 1 in wanted and i + 1 < num_layers:
                captured[i + 1] = x
            if i < deepstack.embeds.shape[0]:
                # Out of place: a captured output keeps the layer's own value.
                x = x.index_add(0, deepstack.rows, deepstack.embeds[i])
        out = self.norm(x)
        if wanted:
            captured[num_layers] = out
            self._captured = torch.cat([captured[i] for i in wanted], dim=-1)
        return out


class CodePredictorLayer(nn.Module):
    """A dense Qwen3 decoder layer (q/k norm, RoPE) over a short per-frame sequence."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // self.num_heads
        bias = getattr(config, "attention_bias", False)
        self.self_attn = nn.Module()
        attn = self.self_attn
        attn.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias, dtype=dtype)
        attn.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias, dtype=dtype)
        attn.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias, dtype=dtype)
        attn.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias, dtype=dtype)
        attn.q_norm = RMSNorm(self.head_dim, eps, dtype)
        attn.k_norm = RMSNorm(self.head_dim, eps, dtype)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(hidden, config.intermediate_size, False, dtype=dtype)
        self.mlp.up_proj = nn.Linear(hidden, config.intermediate_size, False, dtype=dtype)
        self.mlp.down_proj = nn.Linear(config.intermediate_size, hidden, False, dtype=dtype)
        self.input_layernorm = RMSNorm(hidden, eps, dtype)
        self.post_attention_layernorm = RMSNorm(hidden, eps, dtype)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: list[torch.Tensor],
    ) -> torch.Tensor:
        """x [B, T, H]; cos/sin [T, d]; `cache` ([k, v] of the earlier positions, or empty)
        is extended in place."""
        b, t, _ = x.shape
        attn = self.self_attn
        h = self.input_layernorm(x)
        q = attn.q_norm(attn.q_proj(h).view(b, t, self.num_heads, self.head_dim))
        k = attn.k_norm(attn.k_proj(h).view(b, t, self.num_kv_heads, self.head_dim))
        v = attn.v_proj(h).view(b, t, self.num_kv_heads, self.head_dim)
        cos, sin = cos[None, :, None], sin[None, :, None]
        q, k = _rotate(q, cos, sin).transpose(1, 2), _rotate(k, cos, sin).transpose(1, 2)
        v = v.transpose(1, 2)
        if cache:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        cache[:] = [k, v]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, enable_gqa=True)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        h = self.post_attention_layernorm(x)
        mlp = self.mlp
        return x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))


class CodePredictor(nn.Module):
    """`talker.code_predictor`: writes a frame's codes 1..G-1 from the talker's state."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeRotaryEmbedding,
        )

        groups = config.num_code_groups
        self.num_codes = groups - 1
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(
            CodePredictorLayer(config, dtype) for _ in range(config.num_hidden_layers)
        )
        self.model.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.model.codec_embedding = nn.ModuleList(
            nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
            for _ in range(self.num_codes)
        )
        self.lm_head = nn.ModuleList(
            nn.Linear(config.hidden_size, config.vocab_size, False, dtype=dtype)
            for _ in range(self.num_codes)
        )
        self.rotary = RotaryEmbedding(Qwen3OmniMoeRotaryEmbedding(config), groups + 1, dtype)
        self.requires_grad_(False)

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """[n, G-1] codes 1..G-1 -> the sum of their embeddings [n, H]."""
        tables = self.model.codec_embedding
        out = tables[0](codes[:, 0])
        for j in range(1, self.num_codes):
            out = out + tables[j](codes[:, j])
        return out

    def generate(
        self,
        talker_hidden: torch.Tensor,
        first_code_embeds: torch.Tensor,
        sample: Any,
    ) -> torch.Tensor:
        """[B, H] talker hidden and first-code embeddings -> [B, G-1] codes; `sample(j,
        logits)` picks code j+1 of every row."""
        x = torch.stack([talker_hidden, first_code_embeds], dim=1)
        caches: list[list[torch.Tensor]] = [[] for _ in self.model.layers]
        start, codes = 0, []
        for j in range(self.num_codes):
            t = x.shape[1]
            cos, sin = self.rotary.cos[start : start + t], self.rotary.sin[start : start + t]
            for layer, cache in zip(self.model.layers, caches, strict=True):
                x = layer(x, cos, sin, cache)
            start += t
            logits = self.lm_head[j](self.model.norm(x[:, -1])).float()
            code = sample(j, logits)
            codes.append(code)
            if j + 1 < self.num_codes:
                x = self.model.codec_embedding[j](code)[:, None]
        return torch.stack(codes, dim=1)


class Qwen3OmniTalker(Qwen3OmniTalkerDecoder):
    """The talker stage's model: decoder, code predictor and the talker's own sampling.

    Prompts from image questions come with 3-D positions (`Qwen3OmniTalkerPrompter`),
    rotated with interleaved multimodal RoPE as the thinker's; the talker has no
    deepstack (transformers' `generate` gives its talker none)."""

    architectures = ("OmnistageQwen3OmniTalker",)
    prefer_model_sampler = True
    supports_mrope = True

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, dtype, max_positions)
        rope = getattr(config, "rope_parameters", None) or {}
        section = list(rope.get("mrope_section", [24, 20, 20]))  # transformers' default
        # transformers' talker rotary is the thinker's: always interleaved.
        self.layers[0].self_attn.rotary.enable_mrope(section, interleaved=True)
        talker = root_config(config).talker_config
        self.codec_eos_token_id = talker.codec_eos_token_id
        self.code_predictor = CodePredictor(talker.code_predictor_config, dtype)
        self.num_token_codes = self.code_predictor.num_codes
        suppressed = torch.zeros(config.vocab_size, dtype=torch.bool)
        suppressed[config.vocab_size - NUM_SUPPRESSED :] = True
        suppressed[self.codec_eos_token_id] = False
        self.register_buffer("suppressed", suppressed, persistent=False)
        self._sampler = Sampler()
        self._sampling_hidden: torch.Tensor | None = None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self._sampling_hidden = hidden  # read by sample(), which the runner calls next
        return super().compute_logits(hidden)

    def embed_token_codes(self, codes: torch.Tensor) -> torch.Tensor:
        return self.code_predictor.embed(codes)

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        hidden, self._sampling_hidden = self._sampling_hidden, None
        if hidden is None or hidden.shape[0] != logits.shape[0]:
            raise RuntimeError("Qwen3OmniTalker.sample: compute_logits was not called first")
        logits = logits.masked_fill(self.suppressed.to(logits.device), float("-inf"))
        first = self._sampler(logits, metadata)
        residual_md = _code_predictor_metadata(metadata, self.num_token_codes, logits.device)
        residual = self.code_predictor.generate(
            hidden,
            self.embed_tokens(first),
            lambda j, lg: self._sampler(lg, residual_md[j]),
        )
        return torch.cat([first[:, None], residual], dim=1)

    # -- weights ------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        own: dict[str, torch.Tensor] = {}

        def decoder(items: Iterable[tuple[str, torch.Tensor]]):
            for name, tensor in items:
                if name.startswith("code_predictor."):
                    own[name.removeprefix("code_predictor.")] = tensor
                else:
                    yield name, tensor

        loaded = super().load_weights(decoder(weights))
        state = self.code_predictor.state_dict()
        for name, tensor in own.items():
            if name not in state or state[name].shape != tensor.shape:
                raise ValueError(f"checkpoint tensor talker.code_predictor.{name} does not fit")
            state[name].copy_(tensor.to(self.dtype))
            loaded.add(f"code_predictor.{name}")
        return loaded

    def expected_weight_names(self) -> set[str]:
        names = {n for n in super().expected_weight_names() if "code_predictor." not in n}
        return names | {f"code_predictor.{n}" for n in self.code_predictor.state_dict()}


def _code_predictor_metadata(
    md: SamplingMetadata, num_codes: int, device: torch.device
) -> list[SamplingMetadata]:
    """Per code index: the metadata of its draws (greedy rows stay greedy; random rows use
    the code predictor's parameters, seeded by the request and (output position, code))."""
    greedy = [p.temperature < SAMPLING_EPS for p in md.sampling_params]
    out = []
    for j in range(num_codes):
        rows = [
            RowSamplingState(
                sampling_params=_GREEDY if g else _CODE_PREDICTOR_PARAMS,
                seed=(seed ^ _SEED_SALT) & ((1 << 63) - 1),
                prompt_token_ids=[],
                output_token_ids=[],
                output_position=position * num_codes + j,
            )
            for g, seed, position in zip(greedy, md.seeds, md.output_positions, strict=True)
        ]
        out.append(SamplingMetadata.from_requests(rows, device))
    return out


class ResizeMLP(nn.Module):
    """`Qwen3OmniMoeTalkerResizeMLP`: thinker width -> talker width."""

    def __init__(self, inner: int, outer: int, inter: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(inner, inter, True, dtype=dtype)
        self.linear_fc2 = nn.Linear(inter, outer, True, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


def load_part_tensors(path: Path, names: dict[str, str]) -> dict[str, torch.Tensor]:
    """The checkpoint tensors whose names start with a key of `names`, renamed to its value
    (read lazily: only those tensors are loaded)."""
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                for prefix, ours in names.items():
                    if key.startswith(prefix):
                        out[ours + key[len(prefix) :]] = f.get_tensor(key)
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
        self.codec_embedding = nn.Embedding(talker.text_config.vocab_size, hidden, dtype=dtype)
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
        # User part: every prompt position whose latest <|im_start|> opens a user turn.
        positions = torch.arange(len(prompt_ids))
        starts = torch.where(prompt == cfg.im_start_token_id, positions, -1)
        previous = torch.cummax(starts, dim=0).values.clamp_min(0)
        role = prompt[(previous + 1).clamp_max(len(prompt_ids) - 1)]
        user = (role == cfg.user_token_id).nonzero().flatten()
        multimodal = torch.isin(seq[user], self.multimodal_ids)
        user_rows = self.text_projection(embeds[user])
        if multimodal.any():
            user_rows[multimodal] = self.hidden_projection(hidden[user[multimodal]])
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
        from omnistage.multimodal.qwen3_omni import mrope_positions

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
