"""What every model family builds on: the model base classes, loading (HF safetensors, GGUF),
built-in names, tokenizers, and the registry of families (`omnistage/families/`)."""
