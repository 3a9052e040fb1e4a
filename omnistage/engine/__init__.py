"""Frontend side of one autoregressive stage: building it, feeding it, reading its outputs."""
