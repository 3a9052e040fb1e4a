"""POST /v1/completions: string, token-id and list prompts, streaming, echo, logprobs."""

from __future__ import annotations

from tests.server.conftest import TINY


def _complete(client, prompt, **kwargs):
    return client.completions.create(model=TINY, prompt=prompt, **kwargs)


def test_string_prompt_defaults_to_16_tokens(client, server):
    out = _complete(client, "Once upon a time", temperature=0, extra_body={"ignore_eos": True})
    assert out.object == "text_completion"
    (choice,) = out.choices
    assert choice.finish_reason == "length" and out.usage.completion_tokens == 16
    assert out.usage.prompt_tokens == len("Once upon a time")  # a byte tokenizer
    server.wait_idle()


def test_list_prompts_number_choices_prompt_major(client):
    prompts = ["abc", "hello world", "xyz"]
    kwargs = dict(n=2, max_tokens=4, seed=9, temperature=1.0, extra_body={"ignore_eos": True})
    out = _complete(client, prompts, **kwargs)
    assert [c.index for c in out.choices] == list(range(6))
    assert out.usage.prompt_tokens == sum(len(p) for p in prompts)
    assert out.usage.completion_tokens == 6 * 4
    alone = _complete(client, "hello world", **kwargs)
    assert [c.text for c in out.choices[2:4]] == [c.text for c in alone.choices]


def test_token_id_prompts_equal_their_text(client):
    text = _complete(client, "hi there", max_tokens=6, temperature=0).choices[0].text
    ids = [ord(c) - ord("!") + 3 for c in "hi"]  # byte tokenizer: "!" is id 3
    by_ids = _complete(client, ids, max_tokens=6, temperature=0).choices[0].text
    assert by_ids == _complete(client, "hi", max_tokens=6, temperature=0).choices[0].text
    both = _complete(client, [ids, ids], max_tokens=6, temperature=0)
    assert [c.text for c in both.choices] == [by_ids, by_ids]
    assert text  # something was generated


def test_streamed_completions_add_up(client):
    kwargs = dict(n=2, max_tokens=10, seed=4, temperature=1.0, extra_body={"ignore_eos": True})
    whole = _complete(client, ["one", "two"], **kwargs)
    texts: dict[int, str] = {}
    usage = {"include_usage": True}
    chunks = list(_complete(client, ["one", "two"], stream=True, stream_options=usage, **kwargs))
    for chunk in chunks:
        assert chunk.object == "text_completion"
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert [texts[i] for i in range(4)] == [c.text for c in whole.choices]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 40


def test_echo_and_logprobs(client):
    out = _complete(client, "abc", max_tokens=3, temperature=0, echo=True)
    plain = _complete(client, "abc", max_tokens=3, temperature=0)
    assert out.choices[0].text == "abc" + plain.choices[0].text
    lp = _complete(client, "abc", max_tokens=5, temperature=0, logprobs=2).choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(len(top) <= 2 for top in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset)
