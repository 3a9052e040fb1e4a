"""GET /v1/models and GET /v1/models/{model}: the names this server answers to."""

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
        return ModelCard(
            id=name,
            created=self.ctx.created,
            root=self.ctx.model_path,
            max_model_len=self.ctx.client.max_model_len,
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
