"""A step's fed-back codes (`worker/input_embeds.py`): a model whose `feed_back_codes`
works row by row (`codes_feed_back_by_row`, the code predicting talkers) gets one call for
every fed-back row of the step, with input embeddings bit-identical to one call per
request; other models still get one call per request."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from omnistage.families.qwen3_omni.code_predictor import CodePredictor
from omnistage.layers.rotary import DefaultRope
from omnistage.worker.input_embeds import InputEmbeds

CODES = 15
VOCAB = 64
HIDDEN = 32


def _predictor() -> CodePredictor:
    config = SimpleNamespace(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        attention_bias=False,
        num_code_groups=CODES + 1,
    )
    predictor = CodePredictor(config, torch.float32, DefaultRope(config), None)
    g = torch.Generator().manual_seed(0)
    for p in predictor.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.7)
    return predictor


class _Talker:
    """The parts of a code predicting talker `InputEmbeds` reads, counting feed-backs."""

    num_token_codes = CODES
    token_codes_are_floats = False

    def __init__(self, by_row: bool) -> None:
        self.codes_feed_back_by_row = by_row
        self.predictor = _predictor()
        self.table = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(1))
        self.calls: list[int] = []

    def embed_input_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]

    def feed_back_codes(self, token_embeds: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        self.calls.append(codes.shape[0])
        return token_embeds + self.predictor.embed(codes)


def _state(req: int, prompt: int, outputs: int, computed: int, conditioned: bool, fill=True):
    g = torch.Generator().manual_seed(100 + req)
    codes = torch.randint(0, VOCAB, (outputs, CODES), generator=g).tolist()
    return SimpleNamespace(
        num_computed_tokens=computed,
        prompt_token_ids=list(range(prompt)),
        prompt_embeds=torch.randn(prompt, HIDDEN, generator=g) if req % 2 else None,
        conditioning=torch.randn(3, HIDDEN, generator=g) if conditioned else None,
        conditioning_fill=torch.randn(HIDDEN, generator=g) if conditioned and fill else None,
        output_codes=codes,
    )


STATES = [
    (0, 4, 6, 9, False),  # decode: output 5, no conditioning
    (1, 5, 2, 6, True),  # decode: output 1, its conditioning row
    (2, 7, 0, 2, False),  # prompt chunk [2, 6): nothing fed back
    (3, 3, 8, 1, True),  # recompute [1, 9): prompt 1..2, outputs 0..5 (rows, then the fill)
    (4, 2, 4, 6, False),  # output 4 has no codes yet
    (5, 2, 6, 2, True, False),  # outputs 0..4: conditioning rows 0..2, then no fill
]
COUNTS = [1, 1, 4, 8, 1, 5]


def _step(by_row: bool) -> tuple[torch.Tensor, list[int], _Talker, torch.Tensor]:
    states = [_state(*s) for s in STATES]
    model = _Talker(by_row)
    batch = SimpleNamespace(states=dict(enumerate(states)))
    ids = torch.randint(0, VOCAB, (sum(COUNTS),), generator=torch.Generator().manual_seed(2))
    inputs = SimpleNamespace(input_ids=ids, rows=list(range(len(COUNTS))), row_counts=COUNTS)
    embeds = InputEmbeds(model, batch, torch.device("cpu"))
    embeds.own.update({"a"})
    return embeds.prompt_embeds(inputs), model.calls, model, ids


def _expected(model: _Talker, ids: torch.Tensor) -> torch.Tensor:
    """Row by row, as one request alone at a time would make it."""
    rows, at = [], 0
    for spec, n in zip(STATES, COUNTS, strict=True):
        state = _state(*spec)
        prompt = len(state.prompt_token_ids)
        for pos in range(state.num_computed_tokens, state.num_computed_tokens + n):
            row = model.table[ids[at]]
            if pos < prompt:
                rows.append(row if state.prompt_embeds is None else state.prompt_embeds[pos])
                at += 1
                continue
            out = pos - prompt
            if state.conditioning is not None and out < state.conditioning.shape[0]:
                row = row + state.conditioning[out]
            elif state.conditioning_fill is not None:
                row = row + state.conditioning_fill
            if out < len(state.output_codes):
                codes = torch.tensor([state.output_codes[out]])
                row = (row[None] + model.predictor.embed(codes))[0]
            rows.append(row)
            at += 1
    return torch.stack(rows)


def test_one_call_a_step_equals_one_call_per_request():
    batched, batched_calls, model, ids = _step(by_row=True)
    alone, alone_calls, _, _ = _step(by_row=False)
    assert batched_calls == [1 + 1 + 6 + 5]
    assert alone_calls == [1, 1, 6, 5]
    assert torch.equal(batched, alone)
    assert torch.equal(batched, _expected(model, ids))
