"""llama.cpp's /tokenize, /detokenize, /apply-template and /props, and
OpenAI's input token counts, against a real server process: the tokens are
tiktoken's o200k_harmony (special tokens parsed or not), the template the
prompt the chat renders, the counts the usage the generating routes report
for the same request (read through the official openai client)."""
import gguf
import pytest

from corpus import corpus
from goosedump.sampling import SamplingParams
from refs import tiktoken_harmony
from test_server import CTX, KEY, MODEL, USER, WEATHER, client, httpx, post, server  # noqa: F401 (fixtures)

TEXTS = corpus()[::60] + ["Hello <|start|> wörld á", "日本語のテキスト", "<|channel|>analysis<|message|>x<|end|>",
                          ""]


def test_tokenize_is_tiktokens_and_detokenize_inverts_it(server, tiny_model):
    tt = tiktoken_harmony()
    # the special tokens the file defines (tiktoken's reserved ids past them are placeholders in GGUF files)
    specials = {tiny_model.tokenizer.decode([i]) for i in tiny_model.tokenizer.special_ids}
    for text in TEXTS:
        ids = post(server, "/tokenize", {"content": text}).json()["tokens"]
        assert ids == tt.encode(text, allowed_special=specials, disallowed_special=()), text
        plain = post(server, "/tokenize",
                     {"content": text, "parse_special": False, "with_pieces": True}).json()["tokens"]
        assert [p["id"] for p in plain] == tt.encode(text, allowed_special=set(), disallowed_special=())
        # a piece is text where its bytes are UTF-8 by themselves, else the bytes
        joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in plain)
        assert joined == text.encode()
        assert all(isinstance(p["piece"], str) == _utf8(tt.decode_single_token_bytes(p["id"])) for p in plain)
        assert post(server, "/detokenize", {"tokens": ids}).json() == {"content": text}
    # gpt-oss's vocabulary adds no BOS: add_special changes nothing
    assert post(server, "/tokenize", {"content": "hi", "add_special": True}).json() == {"tokens": tt.encode("hi")}


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_apply_template_is_the_chats_prompt(server, client, tiny_model):
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    body = {"messages": messages, "tools": [WEATHER], "reasoning_effort": "high"}
    prompt = post(server, "/apply-template", body).json()["prompt"]
    ids = tiny_model.render_chat(messages, tools=[WEATHER], reasoning_effort="high")
    assert prompt == tiny_model.tokenizer.decode(ids)
    assert post(server, "/tokenize", {"content": prompt}).json()["tokens"] == ids
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], reasoning_effort="high",
                                       max_tokens=1)
    assert r.usage.prompt_tokens == len(ids)


def test_input_token_counts_are_the_usage_of_the_same_request(server, client):
    tool = {**WEATHER["function"], "type": "function"}
    count = client.responses.input_tokens.count(model=MODEL, input="What is the capital of France?",
                                                 instructions="Be brief.", tools=[tool])
    r = client.responses.create(model=MODEL, input="What is the capital of France?", instructions="Be brief.",
                                tools=[tool], max_output_tokens=1)
    assert count.object == "response.input_tokens" and count.input_tokens == r.usage.input_tokens
    assert client.responses.input_tokens.count(model=MODEL, instructions="Be brief.").input_tokens > 0
    chat = post(server, "/v1/chat/completions/input_tokens", {"messages": USER, "tools": [WEATHER]}).json()
    r = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER], max_tokens=1)
    assert chat == {"object": "response.input_tokens", "input_tokens": r.usage.prompt_tokens}


def test_props_describe_the_server(server, tiny_path):
    p = httpx.get(server + "/props", headers={"Authorization": f"Bearer {KEY}"}).json()
    reader = gguf.GGUFReader(tiny_path)
    assert p["model_path"] == tiny_path and p["total_slots"] == 4
    assert p["chat_template"] == reader.fields["tokenizer.chat_template"].contents()
    d = SamplingParams()
    settings = p["default_generation_settings"]
    assert settings["n_ctx"] == CTX
    assert (settings["params"]["temperature"], settings["params"]["top_p"]) == (d.temperature, d.top_p)


@pytest.mark.parametrize("path,body,status,phrase", [
    ("/detokenize", {"tokens": [1, -2]}, 400, "tokens holds -2"),
    ("/detokenize", {"tokens": [10 ** 9]}, 400, "not a token id of this model"),
    ("/tokenize", {"text": "hi"}, 400, "Invalid 'content'"),
    ("/apply-template", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role must be"),
    ("/v1/chat/completions/input_tokens", {"model": "other", "messages": USER}, 404, "does not exist"),
    ("/tokenize", {"content": "hi"}, 401, "No API key"),
])
def test_refusals_are_named(server, path, body, status, phrase):
    r = post(server, path, body, key=None if status == 401 else KEY)
    assert r.status_code == status and phrase in r.json()["error"]["message"], r.text
