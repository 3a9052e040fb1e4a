"""User-facing entry points: the offline `LLM` API and the `omnistage` CLI."""
