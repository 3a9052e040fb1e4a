"""The tiny demo's `speech_tokenizer_v3.onnx` and `campplus.onnx`, random weights.

Each keeps the interface the reference's frontend drives (`cosyvoice/cli/frontend.py`:
inputs by position, the first output read) and the real value ranges, with a small
stand-in network behind it (the real graphs, a whisper-style FSMN encoder and a
D-TDNN, are not reproduced; their exports are not downloadable here):

- speech tokenizer: `feats` `[1, 128, frames]` float32 (whisper log-mel) and
  `feats_length` `[1]` int32 in; `indices` `[1, frames / 4]` int64 out. Two stride-2
  convolutions (25 tokens a second from 100 frames), a projection to 8 dims and the
  finite scalar quantiser of S3Tokenizer v2/v3 (`round(0.999 * tanh(h)) + 1` as base-3
  digits), so ids span the real 6561-token codebook;
- CAM++: `input` `[1, frames, 80]` float32 (mean-normalised fbank) in; `output`
  `[1, 192]` out. A convolution, mean and standard-deviation pooling over time, and a
  dense layer to the real 192 dims.

Initializer names follow the S3Tokenizer / 3D-Speaker module names (`encoder.conv1`,
`quantizer._codebook.project_down`, `xvector.dense.linear`) and the tokenizer's nodes the
torch exporter's (`/conv1/Conv`, ...); the real exports name most weights `onnx::Conv_N`
after the node they feed. Nothing reads these names: the front end, like the reference,
feeds inputs by position and reads the first output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

OPSET = 17
TOKENIZER_WIDTH = 16
CAMPPLUS_WIDTH = 16
FSQ_DIMS = 8
EMBEDDING_DIM = 192


def _init(name: str, array: np.ndarray) -> object:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.ascontiguousarray(array), name)


def _save(graph: object, file: Path) -> None:
    import onnx
    from onnx import helper

    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="omnistage"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(file))


def make_speech_tokenizer(file: Path, seed: int) -> None:
    """Write the tiny speech tokenizer (module docstring) to `file`."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    w = TOKENIZER_WIDTH
    inits = [
        _init("encoder.conv1.weight", rng.normal(0, 0.15, (w, 128, 3)).astype(np.float32)),
        _init("encoder.conv1.bias", rng.normal(0, 0.1, (w,)).astype(np.float32)),
        _init("encoder.conv2.weight", rng.normal(0, 0.3, (w, w, 3)).astype(np.float32)),
        _init("encoder.conv2.bias", rng.normal(0, 0.1, (w,)).astype(np.float32)),
        _init(
            "quantizer._codebook.project_down.weight",
            rng.normal(0, 0.6, (w, FSQ_DIMS)).astype(np.float32),
        ),
        _init(
            "quantizer._codebook.project_down.bias",
            rng.normal(0, 0.1, (FSQ_DIMS,)).astype(np.float32),
        ),
        _init("fsq_scale", np.array(0.999, dtype=np.float32)),
        _init("fsq_one", np.array(1.0, dtype=np.float32)),
        _init("fsq_powers", (3.0 ** np.arange(FSQ_DIMS)).astype(np.float32)),
    ]
    conv = {"kernel_shape": [3], "pads": [1, 1], "strides": [2]}
    n = helper.make_node
    nodes = [
        n(
            "Conv",
            ["feats", "encoder.conv1.weight", "encoder.conv1.bias"],
            ["c1"],
            "/conv1/Conv",
            **conv,
        ),
        n("Relu", ["c1"], ["r1"]),
        n(
            "Conv",
            ["r1", "encoder.conv2.weight", "encoder.conv2.bias"],
            ["c2"],
            "/conv2/Conv",
            **conv,
        ),
        n("Relu", ["c2"], ["r2"]),
        n("Transpose", ["r2"], ["h"], perm=[0, 2, 1]),
        n(
            "MatMul",
            ["h", "quantizer._codebook.project_down.weight"],
            ["p"],
            "/quantizer/_codebook/project_down/MatMul",
        ),
        n("Add", ["p", "quantizer._codebook.project_down.bias"], ["pb"]),
        n("Tanh", ["pb"], ["t"]),
        n("Mul", ["t", "fsq_scale"], ["ts"]),
        n("Round", ["ts"], ["digits0"]),
        n("Add", ["digits0", "fsq_one"], ["digits"]),
        n("MatMul", ["digits", "fsq_powers"], ["ids"]),
        n("Cast", ["ids"], ["indices"], to=TensorProto.INT64),
    ]
    graph = helper.make_graph(
        nodes,
        "speech_tokenizer_v3",
        [
            helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "frames"]),
            helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1]),
        ],
        [helper.make_tensor_value_info("indices", TensorProto.INT64, [1, "tokens"])],
        initializer=inits,
    )
    _save(graph, file)


def make_campplus(file: Path, seed: int) -> None:
    """Write the tiny CAM++ (module docstring) to `file`."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    c = CAMPPLUS_WIDTH
    inits = [
        _init("xvector.tdnn.linear.weight", rng.normal(0, 0.1, (c, 80, 3)).astype(np.float32)),
        _init("xvector.tdnn.linear.bias", rng.normal(0, 0.1, (c,)).astype(np.float32)),
        _init(
            "xvector.dense.linear.weight",
            rng.normal(0, 0.3, (2 * c, EMBEDDING_DIM)).astype(np.float32),
        ),
        _init("xvector.dense.linear.bias", np.zeros(EMBEDDING_DIM, dtype=np.float32)),
        _init("std_eps", np.array(1e-5, dtype=np.float32)),
    ]
    n = helper.make_node
    nodes = [
        n("Transpose", ["input"], ["x"], perm=[0, 2, 1]),
        n(
            "Conv",
            ["x", "xvector.tdnn.linear.weight", "xvector.tdnn.linear.bias"],
            ["c"],
            kernel_shape=[3],
            pads=[1, 1],
        ),  # fmt: skip
        n("Relu", ["c"], ["h"]),
        n("ReduceMean", ["h"], ["mean"], axes=[2], keepdims=1),
        n("Sub", ["h", "mean"], ["centred"]),
        n("Mul", ["centred", "centred"], ["sq"]),
        n("ReduceMean", ["sq"], ["var"], axes=[2], keepdims=0),
        n("Add", ["var", "std_eps"], ["var_eps"]),
        n("Sqrt", ["var_eps"], ["std"]),
        n("Squeeze", ["mean", "axis2"], ["mean2"]),
        n("Concat", ["mean2", "std"], ["stats"], axis=1),
        n("MatMul", ["stats", "xvector.dense.linear.weight"], ["e"]),
        n("Add", ["e", "xvector.dense.linear.bias"], ["output"]),
    ]
    inits.append(_init("axis2", np.array([2], dtype=np.int64)))
    graph = helper.make_graph(
        nodes,
        "campplus",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "frames", 80])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, EMBEDDING_DIM])],
        initializer=inits,
    )
    _save(graph, file)
