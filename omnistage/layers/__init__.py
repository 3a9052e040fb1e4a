"""What models are built from: linear layers (`linear`, quantized ones in
`quantized_linear`), norms (`norm`), rotary embeddings (`rotary`), and in time attention
and the forward context (DESIGN.md section 6).

A layer here imports only `platforms/`, `kernels/`, `config` and torch.
"""
