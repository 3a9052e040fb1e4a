"""Model files (loading, GGUF conversion, built-in names) and model implementations."""
