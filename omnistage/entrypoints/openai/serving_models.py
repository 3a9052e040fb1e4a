"""GET /v1/models and GET /v1/models/{model}: the names this server answers to.

A card is OpenAI's (`id`, `object`, `created`, `owned_by`) with extensions that say
what the model can do, read from the `EngineClient`: `max_model_len`,
`input_modalities` (text, plus the media a chat message may carry),
`output_modalities` (text where chat writes it, audio where it speaks, image where it
draws) and `chat_modalities` (what a chat's `modalities` may ask for). The playground
reads them to show only what the model answers.
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi import APIRouter

from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.protocol import ErrorResponse, ModelCard, ModelList
from omnistage.entrypoints.openai.serving import OpenAIServing


class ModelsServing(OpenAIServing):
    def register(self, router: APIRouter) -> None:
        router.add_api_route("/v1/models", self.list_models, methods=["GET"])
        router.add_api_route(
            "/v1/models/{model:path}",
            self.retrieve,
            methods=["GET"],
            responses={404: {"model": ErrorResponse}},
        )

    def _card(self, name: str) -> ModelCard:
        client = self.ctx.client
        makes = {"text": "text" in client.produces, "audio": client.speaks, "image": client.draws}
        return ModelCard(
            id=name,
            created=self.ctx.created,
            root=self.ctx.model_path,
            max_model_len=client.max_model_len,
            input_modalities=["text", *sorted(client.input_modalities)],
            output_modalities=[m for m, made in makes.items() if made],
            chat_modalities=list(client.produces),
        )

    async def list_models(self) -> ModelList:
        return ModelList(data=[self._card(name) for name in self.ctx.served_model_names])

    async def retrieve(self, model: str) -> ModelCard:
        if model not in self.ctx.served_model_names:
            raise OpenAIError(
                f"model: the model `{model}` does not exist",
                HTTPStatus.NOT_FOUND,
                param="model",
                code="model_not_found",
            )
        return self._card(model)
