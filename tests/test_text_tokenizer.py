"""`TextTokenizer` (tokenizers alone) gives transformers' ids, text, special tokens and
rendered chats; what it does not do itself goes to transformers'; a text engine starts and
chats without importing transformers."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest
import transformers

from omnistage.models.loader import resolve_model
from omnistage.models.text_tokenizer import TextTokenizer, load_text_tokenizer
from omnistage.models.tiny_checkpoints import make_checkpoint

TEXTS = [
    "Hello world",
    " leading space and  double  spaces",
    "héllo ünïcode 日本語 😀",
    "<|im_start|>user\nhi<|im_end|>",
    "",
    "a\n\nb\tc",
]
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4", "tool_calls": None},
    {"role": "user", "content": "And 3+3?"},
]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
# Uses the special tokens, tools, a caller's variable, loop controls, tojson, namespace.
RICH_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(n=0) %}"
    "{% if tools %}TOOLS {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'system' and skip_system %}{% continue %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m.reasoning_content %}[{{ m.reasoning_content }}]{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {{ ns.n }}\n{% endif %}"
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    tiny = make_checkpoint(tmp_path_factory.mktemp("tok") / "tiny", "llama")
    rich = make_checkpoint(tmp_path_factory.mktemp("tok") / "rich", "llama")
    (rich / "chat_template.jinja").write_text(RICH_TEMPLATE)
    return {"tiny": tiny, "rich": rich, "smollm2": resolve_model("smollm2").path}


@pytest.mark.parametrize("name", ["tiny", "rich", "smollm2"])
def test_ids_text_and_special_tokens_equal_transformers(checkpoints, name):
    ours = load_text_tokenizer(checkpoints[name])
    theirs = transformers.AutoTokenizer.from_pretrained(checkpoints[name])
    assert isinstance(ours, TextTokenizer)
    for text in TEXTS:
        for special in (True, False):
            ids = theirs.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == ids, text
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                    ids, skip_special_tokens=skip
                )
    ids = list(range(0, len(theirs), 7))
    assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
    assert ours.convert_ids_to_tokens(5) == theirs.convert_ids_to_tokens(5)
    tokens = ["<|im_end|>", "zzqq-not-a-token", *theirs.convert_ids_to_tokens(ids)]
    assert ours.convert_tokens_to_ids(tokens) == theirs.convert_tokens_to_ids(tokens)
    assert ours.special_tokens_map == theirs.special_tokens_map
    for attr in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id", "eos_token"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert len(ours) == len(theirs)
    assert ours.chat_template == theirs.chat_template


@pytest.mark.parametrize("name", ["tiny", "rich", "smollm2"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"add_generation_prompt": True},
        {"add_generation_prompt": False},
        {"add_generation_prompt": True, "tools": TOOLS, "skip_system": True},
    ],
)
def test_rendered_chats_equal_transformers(checkpoints, name, kwargs):
    ours = load_text_tokenizer(checkpoints[name])
    theirs = transformers.AutoTokenizer.from_pretrained(checkpoints[name])
    chat = [*CHAT, {"role": "assistant", "content": "6", "reasoning": "3 and 3"}]
    text = theirs.apply_chat_template(chat, tokenize=False, **kwargs)
    assert ours.apply_chat_template(chat, tokenize=False, **kwargs) == text
    ids = theirs.apply_chat_template(chat, return_dict=False, **kwargs)
    assert ours.apply_chat_template(chat, return_dict=False, **kwargs) == ids
    assert ours._hf is None  # all of it rendered here


def test_what_it_does_not_render_goes_to_transformers(checkpoints):
    ours = load_text_tokenizer(checkpoints["tiny"])
    theirs = transformers.AutoTokenizer.from_pretrained(checkpoints["tiny"])
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    got = ours.apply_chat_template(chat, tokenize=False, continue_final_message=True)
    assert got == theirs.apply_chat_template(chat, tokenize=False, continue_final_message=True)
    as_dict = ours.apply_chat_template(chat)
    assert as_dict["input_ids"] == theirs.apply_chat_template(chat)["input_ids"]
    assert ours("Hello").input_ids == theirs("Hello").input_ids  # __call__ is transformers'
    assert ours._hf is not None


def test_it_pickles_without_its_transformers_tokenizer(checkpoints):
    ours = load_text_tokenizer(checkpoints["tiny"])
    _ = ours.hf
    copy = pickle.loads(pickle.dumps(ours))
    assert copy._hf is None and copy.encode("Hello") == ours.encode("Hello")


def test_other_tokenizer_classes_are_left_to_transformers(checkpoints, tmp_path):
    path = make_checkpoint(tmp_path / "other", "llama")
    settings = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(
        json.dumps({**settings, "tokenizer_class": "LlamaTokenizer"})
    )
    assert load_text_tokenizer(path) is None
    (path / "tokenizer_config.json").write_text(
        json.dumps({**settings, "clean_up_tokenization_spaces": True})
    )
    assert load_text_tokenizer(path) is None


def test_a_text_engine_starts_generates_and_chats_without_transformers():
    code = (
        "import sys\n"
        "from omnistage import LLM, SamplingParams\n"
        "llm = LLM(model='smollm2', executor_backend='inline', async_scheduling=False)\n"
        "p = SamplingParams(temperature=0, max_tokens=4)\n"
        "print(repr(llm.generate(['The capital of France is'], p, use_tqdm=False)[0]"
        ".outputs[0].text))\n"
        "llm.chat([{'role': 'user', 'content': 'Hi'}], p, use_tqdm=False)\n"
        "print('transformers' in sys.modules)\n"
    )
    resolve_model("smollm2")  # converted (and its config cached) before the timed start
    warm = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert warm.returncode == 0, warm.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["' Paris.\\n\\n'", "False"], out.stderr[-2000:]
