"""The OpenAI-compatible server (`omnistage serve`): one serving path for every model.

protocol.py           request / response shapes (pydantic), errors included
errors.py             OpenAI-shaped errors and the app's exception handlers
client.py             EngineClient: what the handlers ask of a model (text or pipeline)
engine_client.py      AsyncEngineClient: a text model's engine on its own thread
request_stream.py     RequestStream: a text request's deltas, engine thread -> event loop
deltas.py             cumulative engine outputs -> per-step deltas (text, tokens, logprobs)
pipeline_client.py    PipelineClient: a multi-stage pipeline (AsyncOmni)
pipeline_stream.py    PipelineStream: a pipeline request's updates as deltas
pipeline_deploy.py    what the server reads from a deploy (context length, stage params)
serving.py            OpenAIServing, the base of each endpoint family, and shared helpers
chat_request.py       what a chat asks of the model, checked against what it can do
serving_chat.py       /v1/chat/completions
serving_completion.py /v1/completions
serving_speech.py     /v1/audio/speech (pipelines that speak)
serving_images.py     /v1/images/generations (pipelines that draw)
serving_models.py     /v1/models
serving_playground.py the browser playground at /ui/ (`--ui`; its files in playground/)
sse.py                server-sent events; aborting work when the client disconnects
metrics.py            Prometheus metrics with a `stage` label
api_server.py         build_app (FastAPI) and serve (uvicorn, graceful shutdown)
"""
