"""ggml's tensor types and the size of their blocks, without importing the `gguf` package.

The numbers are GGUF's (llama.cpp's `ggml.h`; `gguf.constants.GGML_QUANT_SIZES`
holds the same, and a test checks they agree). They live here because importing
`gguf` costs ~0.1 s (its metadata module pulls in yaml and more) on every start,
and a model's start needs only these numbers; `gguf.quants` is imported where a
type without a C kernel is dequantized.
"""

from __future__ import annotations

import enum


class GGMLType(enum.IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


_K = 256
BLOCK_SIZES: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20),
    GGMLType.Q5_0: (32, 22),
    GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34),
    GGMLType.Q8_1: (32, 40),
    GGMLType.Q2_K: (_K, 84),
    GGMLType.Q3_K: (_K, 110),
    GGMLType.Q4_K: (_K, 144),
    GGMLType.Q5_K: (_K, 176),
    GGMLType.Q6_K: (_K, 210),
    GGMLType.Q8_K: (_K, 292),
    GGMLType.IQ2_XXS: (_K, 66),
    GGMLType.IQ2_XS: (_K, 74),
    GGMLType.IQ3_XXS: (_K, 98),
    GGMLType.IQ1_S: (_K, 50),
    GGMLType.IQ4_NL: (32, 18),
    GGMLType.IQ3_S: (_K, 110),
    GGMLType.IQ2_S: (_K, 82),
    GGMLType.IQ4_XS: (_K, 136),
    GGMLType.I8: (1, 1),
    GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4),
    GGMLType.I64: (1, 8),
    GGMLType.F64: (1, 8),
    GGMLType.IQ1_M: (_K, 56),
    GGMLType.BF16: (1, 2),
    GGMLType.TQ1_0: (_K, 54),
    GGMLType.TQ2_0: (_K, 66),
    GGMLType.MXFP4: (32, 17),
    GGMLType.NVFP4: (64, 36),
    GGMLType.Q1_0: (128, 18),
}
"""(values per block, bytes per block) of each type."""
