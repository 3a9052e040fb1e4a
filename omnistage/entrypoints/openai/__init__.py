"""The OpenAI-compatible server (`omnistage serve`).

protocol.py          request / response shapes (pydantic), errors included
errors.py            OpenAI-shaped errors and the app's exception handlers
engine_client.py     AsyncEngineClient: the engine on its own thread, requests as async streams
deltas.py            cumulative engine outputs -> per-step deltas (text, tokens, logprobs)
serving.py           OpenAIServing, the base of each endpoint family, and shared helpers
serving_chat.py      /v1/chat/completions
serving_completion.py /v1/completions
serving_models.py    /v1/models
sse.py               server-sent events; aborting work when the client disconnects
metrics.py           Prometheus metrics with a `stage` label
api_server.py        build_app (FastAPI) and serve (uvicorn, graceful shutdown)
"""
