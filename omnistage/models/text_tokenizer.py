"""A text frontend's tokenizer on the `tokenizers` library, loaded without transformers.

transformers' `AutoTokenizer` costs ~3.3 s at start (import 1.9 s, load 1.4 s)
where `tokenizers` reads tokenizer.json in 0.09 s, and a frontend needs little
of it: encode, decode, ids and tokens, the special tokens, the chat template.
`TextTokenizer` does those on `tokenizers.Tokenizer` with the special tokens of
tokenizer_config.json and the template rendered by `chat_template.py`; any other
attribute, and a chat it does not render itself, goes to transformers'
tokenizer, loaded on first use (`hf`).

`load_text_tokenizer` returns one only for a plain fast tokenizer
(`PLAIN_TOKENIZER_CLASSES`, a tokenizer.json, no decode-time clean-up, one chat
template); other checkpoints get None and load transformers' as before. Tests
check that both give the same ids, text and rendered chats.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

PLAIN_TOKENIZER_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})
"""`tokenizer_class` values whose transformers tokenizer is tokenizer.json as it is: ids
and text come from the `tokenizers` library alone (no class-specific pre- or post-step)."""

SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""transformers' named special tokens (`SPECIAL_TOKENS_ATTRIBUTES`), in its order."""


class TextTokenizer:
    def __init__(
        self,
        path: Path,
        backend: Tokenizer,
        special_tokens: dict[str, str],
        template: str | None,
    ) -> None:
        self.path = path
        self._tokenizer = backend
        """The `tokenizers.Tokenizer` (the detokenizer's `DecodeStream` steps over it)."""
        self.special_tokens_map = special_tokens
        self.chat_template = template
        self._hf: Any = None
        self._hf_lock = threading.Lock()
        for name in SPECIAL_TOKEN_NAMES:
            token = special_tokens.get(name)
            setattr(self, name, token)
            setattr(self, f"{name}_id", None if token is None else backend.token_to_id(token))

    @property
    def hf(self) -> Any:
        """transformers' tokenizer of the same files, loaded once on first use."""
        with self._hf_lock:
            if self._hf is None:
                import transformers

                self._hf = transformers.AutoTokenizer.from_pretrained(
                    self.path, local_files_only=True
                )
            return self._hf

    def __getattr__(self, name: str) -> Any:  # anything not defined here is transformers'
        if name.startswith("__") or name in ("_hf", "_hf_lock", "_tokenizer"):
            raise AttributeError(name)
        return getattr(self.hf, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.hf(*args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_hf", "_hf_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _hf=None, _hf_lock=threading.Lock())

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=False)

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        if kwargs:
            return self.hf.encode(text, add_special_tokens=add_special_tokens, **kwargs)
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> Any:
        if kwargs or not isinstance(token_ids, (int, list, tuple)):
            return self.hf.decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        elif token_ids and isinstance(token_ids[0], (list, tuple)):
            return [self.decode(ids, skip_special_tokens) for ids in token_ids]
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: int | list[int]) -> Any:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        return [self._tokenizer.id_to_token(i) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | list[str] | None) -> Any:
        if tokens is None:
            return None
        if isinstance(tokens, str):
            found = self._tokenizer.token_to_id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def apply_chat_template(
        self,
        conversation: Any,
        tools: Any = None,
        documents: Any = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        **kwargs: Any,
    ) -> Any:
        """transformers' `apply_chat_template`; plain chats rendered to text (or to ids with
        `return_dict=False`) here, anything else (named templates, functions as tools,
        batches, continuing a message, a dict result, tensors, ...) by transformers'."""
        from omnistage.models import chat_template as templates  # jinja2: 45 ms, when used

        rendered_here = (
            (not tokenize or kwargs.get("return_dict") is False)
            and chat_template is None
            and self.chat_template is not None
            and isinstance(conversation, list)
            and bool(conversation)
            and all(type(m) is dict for m in conversation)
            and chat_template_plain(conversation, tools, documents, kwargs)
        )
        if not rendered_here:
            return self.hf.apply_chat_template(
                conversation,
                tools=tools,
                documents=documents,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=tokenize,
                **kwargs,
            )
        kwargs.pop("return_dict", None)
        text = templates.render_chat(
            self.chat_template,
            conversation,
            self.special_tokens_map,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text


_HF_ONLY_TEMPLATE_ARGS = frozenset(
    {
        "continue_final_message",
        "return_tensors",
        "return_assistant_tokens_mask",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "tokenizer_kwargs",
    }
)


def chat_template_plain(conversation: Any, tools: Any, documents: Any, kwargs: dict) -> bool:
    """Whether a chat's arguments are all plain data the template renders as they are."""
    from omnistage.models import chat_template as templates

    return (
        not _HF_ONLY_TEMPLATE_ARGS & kwargs.keys()
        and templates.is_plain(conversation)
        and templates.is_plain(tools)
        and templates.is_plain(documents)
        and templates.is_plain(kwargs)
    )


def load_text_tokenizer(path: Path) -> TextTokenizer | None:
    """The checkpoint's tokenizer as a `TextTokenizer`, or None where it is not a plain
    fast tokenizer (the caller loads transformers' then)."""
    settings = _read_json(path / "tokenizer_config.json")
    if (
        settings is None
        or settings.get("tokenizer_class") not in PLAIN_TOKENIZER_CLASSES
        or settings.get("clean_up_tokenization_spaces")
        or not (path / "tokenizer.json").is_file()
        or (path / "additional_chat_templates").exists()
    ):
        return None
    template = _template(path, settings)
    if template is False:
        return None
    special = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = settings.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None:
            special[name] = str(value)
    return TextTokenizer(path, Tokenizer.from_file(str(path / "tokenizer.json")), special, template)


def _template(path: Path, settings: dict) -> str | None | bool:
    """The one chat template (file, else tokenizer_config's), None without one, False
    where there are several (named templates are transformers')."""
    file = path / "chat_template.jinja"
    if file.is_file():
        return file.read_text()
    template = settings.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    return False


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
