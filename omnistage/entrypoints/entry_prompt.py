"""What the frontends (the CLI, the OpenAI server) know about a pipeline's entry prompt.

Most entry stages take a chat, rendered with their model's template; GLM-Image's
prior renders its prompt itself (it states the image size in it), so a frontend
passes the text as it is. Both `cli` and `openai.pipeline_client` ask here, so the
server does not import the CLI.
"""

from __future__ import annotations

from typing import Any


def entry_builds_its_prompt(spec: Any) -> bool:
    """Whether the entry stage of the deploy `spec` (a `DeploySpec`) renders its prompt
    itself (GLM-Image's prior): the text then goes to it as it is, not as a chat."""
    from omnistage.models import registry
    from omnistage.pipeline.deploy import model_type_of

    (entry,) = spec.entry_stages
    stage = entry.with_part_directory()
    return registry.renders_own_prompt(model_type_of(stage.model), stage.model_part)
