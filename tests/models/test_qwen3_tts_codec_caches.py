"""What the Qwen3-TTS codec decoder keeps between calls without autograd (SnakeBeta's
per-channel factors, the transformer's rotary tables and mask per length, the quantizer's
stacked codebooks) gives the values computed afresh, and follows its parameters when
they change."""

from __future__ import annotations

import pytest
import torch

from omnistage.families.qwen3_tts.codec_convs import SnakeBeta
from omnistage.families.qwen3_tts.codec_decoder import CodecDecoderConfig, Qwen3TTSCodecDecoder


def _fresh_snake(snake: SnakeBeta, x: torch.Tensor) -> torch.Tensor:
    alpha = snake.alpha.exp()[None, :, None]
    beta = snake.beta.exp()[None, :, None]
    return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


def test_snake_factors_follow_the_parameters():
    snake = SnakeBeta(3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, generator=g)
    with torch.no_grad():
        snake.alpha.copy_(torch.randn(3, generator=g))
        assert torch.equal(snake(x), _fresh_snake(snake, x))
        kept = snake._factors
        assert torch.equal(snake(x), _fresh_snake(snake, x))
        assert snake._factors is kept  # kept between calls
        snake.beta.copy_(torch.randn(3, generator=g))  # in place: a new version
        assert torch.equal(snake(x), _fresh_snake(snake, x))
        snake.load_state_dict({"alpha": torch.randn(3, generator=g), "beta": torch.zeros(3)})
        assert torch.equal(snake(x), _fresh_snake(snake, x))
        snake.alpha = torch.nn.Parameter(torch.randn(3, generator=g))  # a new tensor
        assert torch.equal(snake(x), _fresh_snake(snake, x))
    snake.double()
    with torch.inference_mode():
        assert torch.equal(snake(x.double()), _fresh_snake(snake, x.double()))


def test_snake_with_autograd_keeps_nothing_and_has_gradients():
    snake = SnakeBeta(3)
    out = snake(torch.randn(1, 3, 4)).sum()
    out.backward()
    assert snake.alpha.grad is not None and snake._factors is None


def _decoder() -> Qwen3TTSCodecDecoder:
    config = CodecDecoderConfig(
        codebook_size=16,
        codebook_dim=8,
        hidden_size=16,
        latent_dim=8,
        head_dim=8,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=3,
        intermediate_size=16,
        num_hidden_layers=1,
        num_quantizers=4,
        upsample_rates=(2,),
        upsampling_ratios=(2,),
        decoder_dim=8,
    )
    decoder = Qwen3TTSCodecDecoder(config)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in decoder.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    decoder.refresh_codebooks()
    return decoder


def test_decoder_kept_tables_give_the_fresh_decode():
    decoder = _decoder()
    g = torch.Generator().manual_seed(2)
    for length in (1, 5, 7, 5):
        codes = torch.randint(0, 16, (1, 4, length), generator=g)
        fresh = decoder(codes).detach()  # autograd on: computed afresh
        if length == 1:
            assert not decoder.pre_transformer._kept_tables
            assert all(m._factors is None for m in decoder.modules() if isinstance(m, SnakeBeta))
        with torch.inference_mode():
            first, again = decoder(codes), decoder(codes)
        assert torch.equal(first, fresh) and torch.equal(again, fresh)
    transformer = decoder.pre_transformer
    assert sorted(k[0] for k in transformer._kept_tables) == [1, 5, 7]
    cos, sin, mask = transformer._kept_tables[next(iter(transformer._kept_tables))]
    assert mask.dtype == torch.bool


def _per_codebook(rvq, codes: torch.Tensor) -> torch.Tensor:
    return rvq.output_proj(sum(layer.decode(codes[:, k]) for k, layer in enumerate(rvq.vq.layers)))


def test_quantizer_one_lookup_equals_one_per_codebook_and_follows_refresh():
    decoder = _decoder()
    rvq = decoder.quantizer.rvq_rest  # 3 codebooks of 16
    codes = torch.randint(0, 16, (2, 3, 5), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        assert torch.equal(rvq.decode(codes), _per_codebook(rvq, codes))
    with torch.no_grad():
        rvq.vq.layers[1]._codebook.cluster_usage.mul_(3.0)
    decoder.refresh_codebooks()
    with torch.inference_mode():
        assert torch.equal(rvq.decode(codes), _per_codebook(rvq, codes))


def test_quantizer_code_outside_its_codebook_is_an_error_not_the_next_codebook():
    rvq = _decoder().quantizer.rvq_rest
    codes = torch.zeros(1, 3, 2, dtype=torch.long)
    codes[0, 0, 1] = 16  # row 0 of codebook 1 in the stacked table
    with torch.inference_mode(), pytest.raises(IndexError):
        rvq.decode(codes)
