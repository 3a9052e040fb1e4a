"""Diffusion stages: denoising loops over diffusers noise schedulers, batched step by step."""
