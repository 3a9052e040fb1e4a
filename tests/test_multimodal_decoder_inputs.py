"""`MultimodalDecoderInputs` on its own: every refusal of `check` (and the boundaries it
accepts), the output-position table, the prefix-cache digest, and the wire round trip.
The model tests (`tests/multimodal/test_qwen3_omni_image_decode.py`, GLM-Image's prior)
reach it only through whole engines."""

from __future__ import annotations

import types

import pytest
import torch

from omnistage.core.multimodal_inputs import MultimodalDecoderData, MultimodalDecoderInputs

L, HIDDEN, MAX_POS, LAYERS = 5, 4, 16, 3


def _check(mm: MultimodalDecoderInputs, mrope: bool = True, deepstack: bool = True) -> None:
    mm.check(L, HIDDEN, MAX_POS, LAYERS, supports_mrope=mrope, supports_deepstack=deepstack)


def _positions(top: int = MAX_POS - 1, length: int = L) -> torch.Tensor:
    pos = torch.zeros(3, length, dtype=torch.int64)
    pos[2, -1] = top
    return pos


def _mask(visual: tuple[int, ...] = (1, 2)) -> torch.Tensor:
    mask = torch.zeros(L, dtype=torch.bool)
    mask[list(visual)] = True
    return mask


def _feats(layers: int = LAYERS, rows: int = 2, hidden: int = HIDDEN) -> torch.Tensor:
    return torch.randn(layers, rows, hidden, dtype=torch.float64)


def test_everything_at_its_limit_is_accepted():
    _check(MultimodalDecoderInputs())
    _check(MultimodalDecoderInputs(mrope_positions=_positions(), rope_delta=0))
    _check(MultimodalDecoderInputs(mrope_positions=_positions().int(), rope_delta=-3))
    _check(MultimodalDecoderInputs(visual_pos_mask=_mask(), deepstack_embeds=_feats()))
    _check(MultimodalDecoderInputs(visual_pos_mask=_mask(), deepstack_embeds=_feats(layers=1)))
    table = torch.full((3, 1), MAX_POS - 1, dtype=torch.int32)
    _check(MultimodalDecoderInputs(decode_positions=table))
    _check(MultimodalDecoderInputs(mrope_positions=_positions(), decode_positions=table))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mrope_positions": _positions()}, "does not take 3-D"),
        ({"decode_positions": _positions(length=2)}, "decode_positions: this model does not"),
    ],
)
def test_mrope_inputs_for_a_model_without_mrope_are_refused(fields, message):
    with pytest.raises(ValueError, match=f"^mm_decoder_inputs: .*{message}"):
        _check(MultimodalDecoderInputs(**fields), mrope=False)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mrope_positions": [[0] * L] * 3}, "mrope_positions must be an integer torch.Tensor"),
        (
            {"mrope_positions": _positions().float()},
            "mrope_positions must be an integer torch.Tensor",
        ),
        (
            {"mrope_positions": _positions(length=L + 1)},
            rf"mrope_positions: expected shape \(3, {L}\), got \(3, {L + 1}\)",
        ),
        (
            {"mrope_positions": torch.zeros(2, L, dtype=torch.int64)},
            rf"expected shape \(3, {L}\), got \(2, {L}\)",
        ),
        (
            {"mrope_positions": _positions(top=MAX_POS)},
            rf"mrope_positions must lie in \[0, {MAX_POS}\)",
        ),
        ({"mrope_positions": _positions(top=-1)}, rf"mrope_positions must lie in \[0, {MAX_POS}\)"),
        ({"mrope_positions": _positions(), "rope_delta": 1}, "rope_delta must be an integer <= 0"),
        (
            {"mrope_positions": _positions(), "rope_delta": -1.0},
            "rope_delta must be an integer <= 0",
        ),
        ({"rope_delta": -2}, "rope_delta without mrope_positions"),
    ],
)
def test_bad_mrope_positions_are_named(fields, message):
    with pytest.raises(ValueError, match=f"^mm_decoder_inputs: (.*: )?{message}"):
        _check(MultimodalDecoderInputs(**fields))


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([[0], [0], [0]], "must be an integer torch.Tensor"),
        (torch.zeros(3, 2), "must be an integer torch.Tensor"),
        (torch.zeros(3, dtype=torch.int64), r"expected shape \(3, N\) with N >= 1, got \(3,\)"),
        (torch.zeros(2, 4, dtype=torch.int64), r"got \(2, 4\)"),
        (torch.zeros(3, 0, dtype=torch.int64), r"got \(3, 0\)"),
        (torch.full((3, 2), MAX_POS, dtype=torch.int64), rf"must lie in \[0, {MAX_POS}\)"),
        (torch.full((3, 2), -1, dtype=torch.int64), rf"must lie in \[0, {MAX_POS}\)"),
    ],
)
def test_bad_decode_positions_are_named(table, message):
    with pytest.raises(ValueError, match=f"^mm_decoder_inputs: decode_positions: (.*)?{message}"):
        _check(MultimodalDecoderInputs(decode_positions=table))


def test_decode_positions_and_a_rope_delta_are_refused_together():
    mm = MultimodalDecoderInputs(
        mrope_positions=_positions(), rope_delta=-1, decode_positions=_positions(length=2)
    )
    with pytest.raises(ValueError, match="give either decode_positions or rope_delta, not both"):
        _check(mm)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"visual_pos_mask": _mask()}, "visual_pos_mask and deepstack_embeds go together"),
        ({"deepstack_embeds": _feats()}, "visual_pos_mask and deepstack_embeds go together"),
        (
            {"visual_pos_mask": _mask().long(), "deepstack_embeds": _feats()},
            "visual_pos_mask must be a bool torch.Tensor",
        ),
        (
            {"visual_pos_mask": [True] * L, "deepstack_embeds": _feats()},
            "visual_pos_mask must be a bool torch.Tensor",
        ),
        (
            {"visual_pos_mask": torch.ones(L + 1, dtype=torch.bool), "deepstack_embeds": _feats()},
            rf"visual_pos_mask: expected shape \({L},\), got \({L + 1},\)",
        ),
        (
            {"visual_pos_mask": _mask(), "deepstack_embeds": _feats().long()},
            "deepstack_embeds must be a floating-point torch.Tensor",
        ),
        (
            {"visual_pos_mask": _mask(), "deepstack_embeds": [[0.0]]},
            "deepstack_embeds must be a floating-point torch.Tensor",
        ),
        (
            {"visual_pos_mask": _mask(), "deepstack_embeds": _feats(rows=3)},
            rf"deepstack_embeds: expected shape \(layers, 2, {HIDDEN}\) .*got \(3, 3, {HIDDEN}\)",
        ),
        (
            {"visual_pos_mask": _mask(), "deepstack_embeds": _feats(hidden=HIDDEN + 1)},
            rf"expected shape \(layers, 2, {HIDDEN}\)",
        ),
        (
            {"visual_pos_mask": _mask(), "deepstack_embeds": _feats()[0]},
            rf"expected shape \(layers, 2, {HIDDEN}\)",
        ),
        (
            {"visual_pos_mask": _mask(), "deepstack_embeds": _feats(layers=0)},
            rf"expected shape \(layers, 2, {HIDDEN}\)",
        ),
        (
            {"visual_pos_mask": _mask(), "deepstack_embeds": _feats(layers=LAYERS + 1)},
            f"{LAYERS + 1} deepstack layers for a {LAYERS}-layer decoder",
        ),
    ],
)
def test_bad_deepstack_features_are_named(fields, message):
    with pytest.raises(ValueError, match=f"^mm_decoder_inputs: (.*: )?{message}"):
        _check(MultimodalDecoderInputs(**fields))


def test_deepstack_features_for_a_model_without_deepstack_are_refused():
    mm = MultimodalDecoderInputs(visual_pos_mask=_mask(), deepstack_embeds=_feats())
    with pytest.raises(ValueError, match="^mm_decoder_inputs: this model does not take deepstack"):
        _check(mm, deepstack=False)
    _check(MultimodalDecoderInputs(mrope_positions=_positions()), deepstack=False)


def test_output_positions_read_the_table_and_repeat_its_last_column():
    table = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    mm = MultimodalDecoderInputs(decode_positions=table)
    assert mm.output_positions(0, 3).tolist() == table.tolist()
    assert mm.output_positions(1, 1).tolist() == [[11], [21], [31]]
    assert mm.output_positions(2, 3).tolist() == [[12, 12, 12], [22, 22, 22], [32, 32, 32]]
    assert mm.output_positions(5, 2).tolist() == [[12, 12], [22, 22], [32, 32]]
    assert table.tolist() == [[10, 11, 12], [20, 21, 22], [30, 31, 32]]  # not written to


def test_num_deepstack_layers():
    assert MultimodalDecoderInputs().num_deepstack_layers == 0
    mm = MultimodalDecoderInputs(visual_pos_mask=_mask(), deepstack_embeds=_feats(layers=2))
    assert mm.num_deepstack_layers == 2


def _encoded(uses_mrope: bool, deepstack: list[torch.Tensor]) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        uses_mrope=uses_mrope,
        mrope_positions=_positions(),
        rope_delta=torch.tensor(-2),
        visual_pos_mask=_mask(),
        deepstack_embeds=deepstack,
    )


def test_from_encoded_prompt_takes_only_what_the_prompt_uses():
    assert MultimodalDecoderInputs.from_encoded_prompt(_encoded(False, [])) is None
    mrope = MultimodalDecoderInputs.from_encoded_prompt(_encoded(True, []))
    assert torch.equal(mrope.mrope_positions, _positions())
    assert mrope.rope_delta == -2 and type(mrope.rope_delta) is int
    assert mrope.visual_pos_mask is None and mrope.deepstack_embeds is None
    layers = [torch.full((2, HIDDEN), float(k)) for k in range(2)]
    deep = MultimodalDecoderInputs.from_encoded_prompt(_encoded(False, layers))
    assert deep.mrope_positions is None and deep.rope_delta == 0
    assert torch.equal(deep.visual_pos_mask, _mask())
    assert torch.equal(deep.deepstack_embeds, torch.stack(layers))
    both = MultimodalDecoderInputs.from_encoded_prompt(_encoded(True, layers))
    assert both.rope_delta == -2 and both.num_deepstack_layers == 2


def _full() -> MultimodalDecoderInputs:
    return MultimodalDecoderInputs(
        mrope_positions=_positions(),
        rope_delta=-1,
        visual_pos_mask=_mask(),
        deepstack_embeds=torch.arange(2 * 2 * HIDDEN, dtype=torch.float64).view(2, 2, HIDDEN),
    )


def test_the_digest_changes_with_every_field_and_only_with_them():
    base = _full().digest()
    assert len(base) == 16 and _full().digest() == base
    assert MultimodalDecoderInputs().digest() != base
    changed = [
        {"rope_delta": -2},
        {"mrope_positions": _positions(top=3)},
        {"visual_pos_mask": _mask((0, 4))},
        {"deepstack_embeds": _full().deepstack_embeds + 1},
        {"deepstack_embeds": _full().deepstack_embeds.float()},  # same values, other dtype
        {"deepstack_embeds": _full().deepstack_embeds.view(2, 1, 2 * HIDDEN)},  # other shape
        {"decode_positions": _positions(length=2)},
        {"mrope_positions": None},
        {"visual_pos_mask": None, "deepstack_embeds": None},
    ]
    digests = set()
    for fields in changed:
        mm = _full()
        for key, value in fields.items():
            setattr(mm, key, value)
        digests.add(mm.digest())
    assert base not in digests and len(digests) == len(changed)


def test_the_digest_is_stable_and_kept():
    """A pinned value: prefix-cache hashes of inputs without decode positions must not
    change between versions (they salt stored block hashes)."""
    mm = _full()
    assert mm.digest().hex() == PINNED_DIGEST
    mm.rope_delta = 0  # the digest is computed once
    assert mm.digest().hex() == PINNED_DIGEST


PINNED_DIGEST = "e6a163467701578c1044eb2db9746cc4"


def test_the_digest_reads_every_tensor_after_a_missing_one_and_beside_decode_positions():
    def deep(shift: float) -> MultimodalDecoderInputs:
        return MultimodalDecoderInputs(visual_pos_mask=_mask(), deepstack_embeds=_feats() + shift)

    assert deep(0.0).digest() != deep(1.0).digest()  # after an absent mrope_positions
    with_table = [_full(), _full()]
    for mm in with_table:
        mm.rope_delta, mm.decode_positions = 0, _positions(length=2)
    with_table[1].mrope_positions = _positions(top=3)
    assert with_table[0].digest() != with_table[1].digest()


def test_pinned_digests_of_absent_and_empty_tensors():
    only_positions = MultimodalDecoderInputs(mrope_positions=_positions(), rope_delta=-1)
    empty = MultimodalDecoderInputs(
        visual_pos_mask=torch.zeros(L, dtype=torch.bool),
        deepstack_embeds=torch.zeros(1, 0, HIDDEN, dtype=torch.float64),
    )
    assert only_positions.digest().hex() == PINNED_ABSENT
    assert empty.digest().hex() == PINNED_EMPTY


PINNED_ABSENT, PINNED_EMPTY = "0eae18b348bd9c97e6e1659338ba3512", "359954f92cc9b48f713bcede1743c751"


def test_the_wire_round_trip_keeps_every_field():
    mm = _full()
    mm.decode_positions = _positions(length=3).int()
    data = mm.to_data()
    assert isinstance(data, MultimodalDecoderData) and data.rope_delta == -1
    back = MultimodalDecoderInputs.from_data(data, torch.device("cpu"), torch.float32)
    assert torch.equal(back.mrope_positions, mm.mrope_positions)
    assert back.mrope_positions.dtype == torch.int64
    assert back.decode_positions.dtype == torch.int64
    assert torch.equal(back.decode_positions, mm.decode_positions.long())
    assert torch.equal(back.visual_pos_mask, mm.visual_pos_mask)
    assert back.deepstack_embeds.dtype == torch.float32
    assert torch.equal(back.deepstack_embeds, mm.deepstack_embeds.float())
    assert back.rope_delta == -1
    empty = MultimodalDecoderInputs.from_data(
        MultimodalDecoderInputs().to_data(), torch.device("cpu"), torch.float64
    )
    assert empty.mrope_positions is None and empty.visual_pos_mask is None
    assert empty.deepstack_embeds is None and empty.decode_positions is None
    assert empty.rope_delta == 0


def test_deepstack_features_go_to_the_runner_device():
    """The device is honoured (a `meta` device stands for an accelerator here)."""
    data = _full().to_data()
    back = MultimodalDecoderInputs.from_data(data, torch.device("meta"), torch.float32)
    assert back.deepstack_embeds.device.type == "meta"
    assert back.deepstack_embeds.dtype == torch.float32
    assert back.mrope_positions.device.type == "cpu"  # step inputs are built on the CPU


def _modality(codes: tuple[int, ...] = (0, 1, 1, 2, 0)) -> torch.Tensor:
    return torch.tensor(codes, dtype=torch.int64)


def test_a_prompt_with_only_a_token_modality_keeps_it():
    encoded = _encoded(False, [])
    encoded.token_modality = _modality()
    mm = MultimodalDecoderInputs.from_encoded_prompt(encoded)
    assert mm is not None and torch.equal(mm.token_modality, _modality())
    assert mm.mrope_positions is None and mm.deepstack_embeds is None
    both = _encoded(True, [])
    both.token_modality = _modality()
    assert torch.equal(
        MultimodalDecoderInputs.from_encoded_prompt(both).token_modality, _modality()
    )


def test_the_token_modality_salts_the_digest_and_crosses_the_wire():
    def with_codes(codes) -> MultimodalDecoderInputs:
        mm = _full()
        mm.token_modality = None if codes is None else _modality(codes)
        return mm

    digests = {with_codes(c).digest() for c in [None, (0, 1, 1, 2, 0), (0, 2, 2, 1, 0)]}
    assert len(digests) == 3
    other_positions = with_codes((0, 1, 1, 2, 0))
    other_positions.mrope_positions = _positions(top=3)
    assert other_positions.digest() != with_codes((0, 1, 1, 2, 0)).digest()
    assert with_codes(None).digest().hex() == PINNED_DIGEST  # unchanged without it
    assert with_codes((0, 1, 1, 2, 0)).digest().hex() == PINNED_MODALITY
    back = MultimodalDecoderInputs.from_data(
        with_codes((0, 1, 1, 2, 0)).to_data(), torch.device("cpu"), torch.float64
    )
    assert (
        torch.equal(back.token_modality, _modality()) and back.token_modality.dtype == torch.int64
    )
    assert (
        MultimodalDecoderInputs.from_data(
            _full().to_data(), torch.device("cpu"), torch.float64
        ).token_modality
        is None
    )


PINNED_MODALITY = "188821b12fbb3d20efe8cb4478884ac8"


NAMES = ("image", "audio")


def _check_codes(codes, names=NAMES) -> None:
    MultimodalDecoderInputs(token_modality=codes).check(
        L,
        HIDDEN,
        MAX_POS,
        LAYERS,
        supports_mrope=False,
        supports_deepstack=False,
        token_modalities=names,
    )


def test_token_modality_at_its_limits_is_accepted():
    _check_codes(_modality((0, 0, 0, 0, 0)))
    _check_codes(_modality((2, 1, 0, 2, 1)).int())
    _check_codes(_modality((0, 1, 1, 1, 0)), names=("image",))
    _check_codes(None, names=())  # no codes: all text, any model


@pytest.mark.parametrize(
    ("codes", "names", "message"),
    [
        (_modality(), (), "this model takes no per-token modality"),
        ([0, 1, 1, 2, 0], NAMES, "must be an integer torch.Tensor"),
        (_modality().float(), NAMES, "must be an integer torch.Tensor"),
        (_modality().bool(), NAMES, "must be an integer torch.Tensor"),
        (_modality((0, 1, 2)), NAMES, rf"expected shape \({L},\), got \(3,\)"),
        (_modality().view(1, L), NAMES, rf"expected shape \({L},\), got \(1, {L}\)"),
        (
            _modality((0, 1, 3, 0, 0)),
            NAMES,
            "values must be 0 \\(text\\) or one of 1 image, 2 audio",
        ),
        (_modality((0, 2, 0, 0, 0)), ("image",), "values must be 0 \\(text\\) or one of 1 image$"),
        (_modality((0, -1, 0, 0, 0)), NAMES, "values must be 0 \\(text\\) or one of"),
    ],
)
def test_bad_token_modality_is_named(codes, names, message):
    with pytest.raises(ValueError, match=f"^mm_decoder_inputs: token_modality: {message}"):
        _check_codes(codes, names)


def test_check_reads_the_prompt_length_and_the_models_modalities_for_the_codes():
    mm = MultimodalDecoderInputs(token_modality=_modality((0, 1, 2)))
    with pytest.raises(ValueError, match=r"expected shape \(4,\)"):
        mm.check(4, HIDDEN, MAX_POS, LAYERS, False, False, token_modalities=NAMES)
    mm.check(3, HIDDEN, MAX_POS, LAYERS, False, False, token_modalities=NAMES)
