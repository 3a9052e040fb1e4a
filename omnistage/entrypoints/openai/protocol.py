"""Request and response shapes of the OpenAI API, as pydantic models.

Requests forbid unknown fields (`extra="forbid"`) and non-finite floats, and bound
every number, so what the engine cannot honour is a 400 naming the field rather
than something silently ignored or a crash deep in the engine. Fields that OpenAI
defines but this server honours only in part (`modalities`, `response_format`,
`tools`, ...) are declared here and refused by the serving layer when set to what
it cannot do. vLLM's sampling extensions (`top_k`, `min_p`, `ignore_eos`, ...) are
accepted too, so clients and benchmarks written for `vllm serve` work unchanged.

Responses are built, not parsed: their models only give them a schema and a shape.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_N = 128
MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
"""Bounds on `stop`: each stop string is searched for in every new piece of text."""
MAX_CHOICES = 1024
"""At most this many sequences in one completion request (prompts × n)."""
StopString = Annotated[str, Field(max_length=MAX_STOP_CHARS)]


def _integral(value: Any) -> Any:
    """JSON Schema counts 2.0 as an integer; strict pydantic would not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]
"""An integer field: JSON integers, and floats with no fractional part; never strings."""
TokenId = Annotated[Int, Field(ge=0, le=INT32_MAX)]
Bias = Annotated[float, Field(ge=-100, le=100)]


class RequestModel(BaseModel):
    """Base of every request body: unknown fields, NaN / infinity and values of the wrong
    JSON type (strict: "yes" is no boolean, 1.5 and "2" are no integers) are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


# -- errors -------------------------------------------------------------------------------
class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """`{"error": {"message", "type", "param", "code"}}`, as OpenAI answers errors."""

    error: ErrorInfo


# -- shared request parts ---------------------------------------------------------------------
class StreamOptions(RequestModel):
    include_usage: bool = False
    """Send a last chunk with the request's `usage` (and empty `choices`)."""


def _unicode_error(value: Any, path: str) -> str | None:
    """Where `value` holds text that is no valid Unicode (JSON's lone surrogate escapes,
    e.g. "\\ud800", which no tokenizer nor UTF-8 encoder takes), if anywhere."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
    elif isinstance(value, dict):
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            where = _unicode_error(key, sub) or _unicode_error(item, sub)
            if where:
                return where.encode("utf-8", "backslashreplace").decode()
    elif isinstance(value, list):
        for i, item in enumerate(value):
            where = _unicode_error(item, f"{path}[{i}]")
            if where:
                return where
    return None


class SamplingFields(RequestModel):
    """What chat and completion requests share: the model and the sampling fields."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = _unicode_error(data, "")
        if where is not None:
            raise ValueError(f"{where}: text with a lone surrogate is not valid Unicode")
        return data

    model: str
    n: Int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: Int | None = Field(None, ge=1, le=INT32_MAX)
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: Int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, Bias] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extensions
    top_k: Int | None = Field(None, ge=-1, le=INT32_MAX)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=1e4)
    min_tokens: Int = Field(0, ge=0, le=INT32_MAX)
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False


# -- chat requests ---------------------------------------------------------------------------
class TextPart(RequestModel):
    type: Literal["text"]
    text: str


class ImageURL(RequestModel):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(RequestModel):
    type: Literal["image_url"]
    image_url: ImageURL


class InputAudio(RequestModel):
    data: str
    """Base64-encoded audio file."""
    format: Literal["wav", "mp3"]


class AudioPart(RequestModel):
    type: Literal["input_audio"]
    input_audio: InputAudio


ContentPart = Annotated[TextPart | ImagePart | AudioPart, Field(discriminator="type")]


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class AudioOutput(RequestModel):
    format: Literal["wav", "mp3", "flac", "opus", "pcm16", "pcm", "aac"]
    """Pipelines that speak serve wav and pcm16 (raw 16-bit little-endian mono; "pcm" is
    taken as its alias); streamed audio deltas are always pcm16."""
    voice: str


class DrawFields(RequestModel):
    """What a request to a model that draws may set for its image (`size` "WxH"; None: the
    model's defaults): extensions, as vLLM-Omni's, read by the draw stage."""

    size: str | None = None
    num_inference_steps: Int | None = Field(default=None, ge=1, le=1000)
    guidance_scale: float | None = Field(default=None, ge=0, le=100)
    negative_prompt: str | None = None


class ChatCompletionRequest(SamplingFields, DrawFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: Int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    modalities: list[Literal["text", "audio", "image"]] | None = None
    audio: AudioOutput | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM's: extra variables of the chat template (HunyuanImage-3's `bot_task`)."""
    extra_args: dict[str, Any] | None = None
    """vLLM-Omni's: the model's own per-request options (`model_options.py`)."""


# -- completion requests -------------------------------------------------------------------------
Prompt = (
    Annotated[str, Field()]
    | Annotated[list[str], Field(min_length=1)]
    | Annotated[list[TokenId], Field(min_length=1)]
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
)


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: Int | None = Field(16, ge=1, le=INT32_MAX)
    logprobs: Int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: Int | None = Field(None, ge=1, le=MAX_N)


# -- responses ---------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobInfo(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChatChoiceLogprobs(BaseModel):
    content: list[TokenLogprobInfo] | None = None


class ChatAudio(BaseModel):
    """A spoken reply (pipelines that speak): the whole audio file, base64."""

    id: str
    data: str
    expires_at: int
    transcript: str


class ChatAudioDelta(BaseModel):
    """A piece of a streamed spoken reply: base64 pcm16 samples (`id` on the first)."""

    id: str | None = None
    data: str | None = None
    transcript: str | None = None
    expires_at: int | None = None


class ChatImage(BaseModel):
    """A drawn image (OpenRouter's shape): `image_url.url` a `data:image/png;base64,` URL."""

    type: Literal["image_url"] = "image_url"
    image_url: dict[str, str]


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    audio: ChatAudio | None = None
    images: list[ChatImage] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    """vLLM's extension: the stop token id or stop string that ended the choice."""


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    audio: ChatAudioDelta | None = None
    images: list[ChatImage] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    """A whole completion, and (with `stream`) each chunk of one: OpenAI uses one shape."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "omnistage"
    root: str | None = None
    max_model_len: int | None = None
    # Extensions (OpenAI's clients keep extra fields): what the model takes and makes.
    input_modalities: list[str] = ["text"]
    """What its prompts may carry: text, and audio / image parts of chat messages."""
    output_modalities: list[str] = ["text"]
    """What it produces through any endpoint: text, audio (speech), image."""
    chat_modalities: list[str] = ["text"]
    """What `/v1/chat/completions` may be asked for (`modalities`); empty: no chat."""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
