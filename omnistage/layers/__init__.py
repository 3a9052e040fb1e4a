"""What models are built from: linear layers (quantized ones included), and in time
attention, rotary embeddings, norms and the forward context (DESIGN.md section 6).

A layer here imports only `platforms/`, `kernels/`, `config` and torch.
"""
