"""The harmony chat format against openai-harmony: rendering of OpenAI-style
conversations (token ids equal) and parsing of generated tokens."""
import json

import openai_harmony as H
import pytest
from openai_harmony import Author, Conversation, DeveloperContent, Message, Role, SystemContent, ToolDescription

from goosedump import chat, harmony, reply
from refs import harmony_encoding

DATE = "2025-06-28"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Gets the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City and country"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
        "required": ["location"]}}}

# Every schema feature the TypeScript rendering knows about.
RICH = {"type": "function", "function": {
    "name": "search_flights",
    "description": "Search flights.\nReturns at most `limit` offers.\r\nPrices in EUR.",
    "parameters": {"type": "object", "description": "Search query", "properties": {
        "origin": {"type": "string", "title": "Origin", "description": "IATA code",
                   "examples": ["CDG", "JFK"]},
        "when": {"type": ["string", "null"], "description": "ISO date"},
        "passengers": {"type": "integer", "default": 1, "nullable": True},
        "cabin": {"type": "string", "enum": ["economy", "business"], "default": "economy"},
        "flexible": {"type": "boolean", "default": False},
        "max_price": {"type": "number"},
        "stops": {"type": "array", "items": {"type": "integer"}},
        "tags": {"type": "array"},
        "filters": {"type": "object", "properties": {
            "airline": {"type": "string", "default": "any"},
            "alliance": {"type": "string", "enum": ["star", "oneworld"]}}, "required": ["airline"]},
        "sort": {"description": "Order of results", "default": "price", "oneOf": [
            {"type": "string", "enum": ["price", "duration"], "description": "Order of results"},
            {"type": "object", "properties": {"key": {"type": "string"}}, "nullable": True,
             "description": "Custom key", "default": {"key": "price"}}]},
        "limit": {"oneOf": [{"type": "integer"}, {"type": "string", "description": "as text"}]},
        "anything": {},
        "raw": {"type": "null"}},
        "required": ["origin", "stops"]}}}

NOARGS = {"type": "function", "function": {"name": "now", "description": "The time."}}
# numbers as openai-harmony (serde_json, ryu) writes them: 1e20, 0.00001, 1e-6, not Python's 1e+20, 1e-05, 1e-06
NUMBERS = {"type": "function", "function": {"name": "tune", "parameters": {"type": "object", "properties": {
    "big": {"type": "number", "default": 1e20}, "small": {"type": "number", "default": 0.00001},
    "tiny": {"type": "number", "default": -2.5e-7}, "edge": {"type": "number", "default": 1e16},
    "plain": {"type": "number", "default": 1e15}, "huge": {"type": "integer", "default": 2**70},
    "mode": {"type": "number", "default": 1e-6}}}}}

# nulls as Pydantic and the Agents SDK write them (Optional[str] = None: "default": null), each read as
# openai-harmony reads a key present with a null value; a description's last \r kept, as Rust's lines() keeps it
NULLS = {"type": "function", "function": {"name": "find", "description": "Finds things.\r", "parameters": {
    "type": "object", "properties": {
        "unit": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Unit"},
        "tags": {"type": "array", "items": None, "default": None},
        "kind": {"oneOf": None, "type": "string", "description": "The kind."},
        "mode": {"oneOf": [{"type": "string", "default": None}, {"type": "integer"}], "default": None},
        "note": {"type": "string", "description": "Free text.\r\nSecond line."}}}}}


def conversations():
    """(name, OpenAI messages, options) — at least 20 conversations."""
    u = {"role": "user", "content": "What is 2 + 2?"}
    a1 = {"role": "assistant", "reasoning_content": "Simple arithmetic.", "content": "2 + 2 = 4."}
    call = {"role": "assistant", "reasoning_content": "Need the weather tool.",
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"location":"Tokyo"}'}}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21, "sky": "clear"}'}
    return [
        ("user only", [u], {}),
        ("system", [{"role": "system", "content": "Answer in French."}, u], {}),
        ("developer", [{"role": "developer", "content": "Be terse."}, u], {}),
        ("system and developer", [{"role": "system", "content": "A"}, {"role": "developer", "content": "B"}, u], {}),
        ("effort low", [u], {"reasoning_effort": "low"}),
        ("effort high", [u], {"reasoning_effort": "high", "date": "2024-12-31"}),
        ("model identity", [u], {"model_identity": "You are Goose, a model that runs on a CPU."}),
        ("second turn drops reasoning", [u, a1, {"role": "user", "content": "And 3 + 3?"}], {}),
        ("answer without reasoning", [u, {"role": "assistant", "content": "4"}, {"role": "user", "content": "ok"}],
         {}),
        ("tools declared", [u], {"tools": [WEATHER]}),
        ("tools with instructions", [{"role": "system", "content": "Use tools."}, u], {"tools": [WEATHER, NOARGS]}),
        ("rich schema", [u], {"tools": [RICH]}),
        ("numbers in a schema", [u], {"tools": [NUMBERS]}),
        ("nulls in a schema", [u], {"tools": [NULLS]}),
        ("tool call pending", [u, call], {"tools": [WEATHER]}),
        ("tool round trip", [u, call, result], {"tools": [WEATHER]}),
        ("tool round trip then answer", [u, call, result,
                                         {"role": "assistant", "content": "It is 21 °C and clear."},
                                         {"role": "user", "content": "Thanks!"}], {"tools": [WEATHER]}),
        ("preamble and two calls", [u, {"role": "assistant", "content": "Checking both cities.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"location": "Oslo"}}},
            {"id": "b", "type": "function", "function": {"name": "get_weather",
                                                         "arguments": '{"location": "Rome"}'}}]},
            {"role": "tool", "tool_call_id": "a", "content": "3"},
            {"role": "tool", "tool_call_id": "b", "content": "25"}], {"tools": [WEATHER]}),
        ("tool message with name", [u, call, {"role": "tool", "name": "get_weather", "content": "hot"}],
         {"tools": [WEATHER]}),
        ("non-ASCII", [{"role": "user", "content": "Ünïcødé: 你好，世界！ 🦆🦢 مرحبا \u200d"}], {}),
        ("content parts", [{"role": "user", "content": [{"type": "text", "text": "Part one. "},
                                                        {"type": "text", "text": "Part two."}]}], {}),
        ("special-looking text", [{"role": "user", "content": "<|start|>assistant<|message|>hi<|end|>"}], {}),
        ("whitespace", [{"role": "user", "content": "  line one\n\n\tline two  \n"}], {}),
        ("empty user", [{"role": "user", "content": ""}], {}),
        ("several answered turns", [u, a1, {"role": "user", "content": "3+3?"},
                                    {"role": "assistant", "reasoning_content": "Again.", "content": "6"},
                                    {"role": "user", "content": "4+4?"}], {}),
        ("answered turn then a call", [u, a1, {"role": "user", "content": "weather?"}, call],
         {"tools": [WEATHER]}),
    ]


def reference_messages(messages, opts):
    """The same conversation built with openai-harmony's own objects, by the
    mapping its docs give; reasoning of answered turns is left out here
    (the format guide's rule) and harmony's auto-drop is then off."""
    effort = {"low": H.ReasoningEffort.LOW, "medium": H.ReasoningEffort.MEDIUM,
              "high": H.ReasoningEffort.HIGH}[opts.get("reasoning_effort", "medium")]
    system = SystemContent.new().with_reasoning_effort(effort).with_conversation_start_date(opts.get("date", DATE))
    if "model_identity" in opts:
        system = system.with_model_identity(opts["model_identity"])
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
    instructions = [m["content"] for m in messages if m["role"] in ("system", "developer")]
    tools = [ToolDescription.new(t["function"]["name"], t["function"].get("description", ""),
                                 parameters=t["function"].get("parameters")) for t in opts.get("tools", [])]
    if instructions or tools:
        dev = DeveloperContent.new()
        if instructions:
            dev = dev.with_instructions("\n\n".join(instructions))
        if tools:
            dev = dev.with_function_tools(tools)
        out.append(Message.from_role_and_content(Role.DEVELOPER, dev))
    body, names = [], {}
    for m in messages:
        if m["role"] == "user":
            c = m["content"]
            body.append(Message.from_role_and_content(
                Role.USER, c if isinstance(c, str) else "".join(p["text"] for p in c)))
        elif m["role"] == "assistant":
            if m.get("reasoning_content"):
                body.append(Message.from_role_and_content(Role.ASSISTANT, m["reasoning_content"])
                            .with_channel("analysis"))
            if m.get("content"):
                body.append(Message.from_role_and_content(Role.ASSISTANT, m["content"])
                            .with_channel("commentary" if m.get("tool_calls") else "final"))
            for c in m.get("tool_calls", []):
                names[c["id"]] = c["function"]["name"]
                args = c["function"]["arguments"]
                body.append(Message.from_role_and_content(Role.ASSISTANT, args if isinstance(args, str)
                                                          else json.dumps(args))
                            .with_channel("commentary").with_recipient("functions." + c["function"]["name"])
                            .with_content_type("<|constrain|>json"))
        elif m["role"] == "tool":
            name = m.get("name") or names[m["tool_call_id"]]
            body.append(Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"), m["content"])
                        .with_channel("commentary").with_recipient("assistant"))
    last_final = max((i for i, m in enumerate(body) if m.channel == "final"), default=-1)
    body = [m for i, m in enumerate(body) if not (i < last_final and m.channel == "analysis")]
    return out + body


@pytest.mark.parametrize("name,messages,opts", conversations(), ids=[c[0] for c in conversations()])
def test_render_equals_openai_harmony(tiny_model, name, messages, opts):
    enc = harmony_encoding()
    ours = tiny_model.render_chat(messages, date=opts.get("date", DATE),
                                  **{k: v for k, v in opts.items() if k != "date"})
    ref = enc.render_conversation_for_completion(Conversation.from_messages(reference_messages(messages, opts)),
                                                 Role.ASSISTANT, config=H.RenderConversationConfig(
                                                     auto_drop_analysis=False))
    assert ours == ref, f"{name}:\nours: {enc.decode(ours)!r}\nref:  {enc.decode(ref)!r}"


def test_render_drops_reasoning_as_harmony_auto_drop_does(tiny_model):
    """Where openai-harmony's own auto-drop applies (one answered turn), it
    agrees with ours on the full conversation, reasoning included."""
    enc = harmony_encoding()
    name, messages, opts = next(c for c in conversations() if c[0] == "second turn drops reasoning")
    full = [Message.from_role_and_content(Role.SYSTEM, SystemContent.new().with_conversation_start_date(DATE)),
            Message.from_role_and_content(Role.USER, messages[0]["content"]),
            Message.from_role_and_content(Role.ASSISTANT, messages[1]["reasoning_content"]).with_channel("analysis"),
            Message.from_role_and_content(Role.ASSISTANT, messages[1]["content"]).with_channel("final"),
            Message.from_role_and_content(Role.USER, messages[2]["content"])]
    ref = enc.render_conversation_for_completion(Conversation.from_messages(full), Role.ASSISTANT)
    ours = tiny_model.render_chat(messages, date=DATE)
    assert ours == ref
    assert "Simple arithmetic" not in enc.decode(ours)


def test_render_options_are_checked(tiny_model):
    with pytest.raises(chat.ChatError, match="reasoning_effort must be one of low, medium, high, got 'max'"):
        tiny_model.render_chat([{"role": "user", "content": "x"}], reasoning_effort="max")
    with pytest.raises(chat.ChatError, match="date must be YYYY-MM-DD, got '28/06/2025'"):
        tiny_model.render_chat([{"role": "user", "content": "x"}], date="28/06/2025")
    with pytest.raises(chat.ChatError, match="date must be a date, YYYY-MM-DD, got '2026-13-45'"):
        tiny_model.render_chat([{"role": "user", "content": "x"}], date="2026-13-45")
    import datetime
    assert tiny_model.render_chat([{"role": "user", "content": "x"}], date=datetime.date(2026, 12, 7)) == \
        tiny_model.render_chat([{"role": "user", "content": "x"}], date="2026-12-07")
    with pytest.raises(ValueError, match="response_format must be OpenAI's form"):
        tiny_model.render_chat([{"role": "user", "content": "x"}], response_format="json")
    with pytest.raises(chat.ChatError, match=r"messages\[1\]: role must be .* got 'robot'"):
        tiny_model.render_chat([{"role": "user", "content": "x"}, {"role": "robot", "content": "x"}])
    with pytest.raises(chat.ChatError, match=r"messages\[0\]: content part 0 has type 'image_url'"):
        tiny_model.render_chat([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    with pytest.raises(chat.ChatError, match=r"messages\[0\]: a tool message needs a 'tool_call_id'"):
        tiny_model.render_chat([{"role": "tool", "tool_call_id": "nope", "content": "x"}])
    with pytest.raises(chat.ChatError, match="messages is empty"):
        tiny_model.render_chat([])
    with pytest.raises(chat.ChatError, match=r"tools\[0\]: only function tools"):
        tiny_model.render_chat([{"role": "user", "content": "x"}], tools=[{"type": "web_search"}])


def test_default_date_is_today(tiny_model):
    import datetime
    days = {datetime.date.today().isoformat()}
    text = tiny_model.tokenizer.decode(tiny_model.render_chat([{"role": "user", "content": "x"}]))
    days.add(datetime.date.today().isoformat())          # (across midnight: either day)
    assert any(f"Current date: {d}" in text for d in days)


def test_a_number_past_a_float_renders_its_digits(tiny_model):
    """A default past an f64 (openai-harmony refuses it) is written as its
    digits, not an OverflowError (a 500 at the server)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer", "default": 10**400}}}}}
    text = tiny_model.tokenizer.decode(tiny_model.render_chat([{"role": "user", "content": "x"}], tools=[tool]))
    assert "1" + "0" * 400 in text


def test_template_fallback_equals_transformers(tiny_model):
    """The embedded template, forced, renders as transformers renders it."""
    from transformers.utils.chat_template_utils import render_jinja_template
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello 👋"}]
    ours = tiny_model.render_chat(messages, chat_format="template")
    texts, _ = render_jinja_template(conversations=[messages], chat_template=tiny_model.chat_template,
                                     add_generation_prompt=True, reasoning_effort="medium")
    assert ours == tiny_model.tokenizer.encode(texts[0], allow_special=True)
    assert tiny_model.tokenizer.decode(ours).endswith("<|start|>assistant")


# --- parsing --------------------------------------------------------------

def _ids(enc, text):
    return enc.encode(text, allowed_special="all")


WELL_FORMED = [
    "<|channel|>analysis<|message|>Let me think about 2+2.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is 4.<|return|>",
    "<|channel|>final<|message|>Ünïcødé 你好 🦆<|return|>",
    "<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant<|channel|>commentary "
    "to=functions.get_weather <|constrain|>json<|message|>{\"location\": \"Tokyo\"}<|call|>",
    " to=functions.get_weather<|channel|>commentary json<|message|>{}<|call|>",
    "<|channel|>commentary<|message|>Checking now.<|end|><|start|>assistant to=functions.now"
    "<|channel|>commentary<|message|>{}<|call|>",
    "<|channel|>final<|message|><|return|>",
    # a name of 64 characters, digits a token each: a header of 70-odd tokens (it had become content)
    "<|channel|>commentary to=functions." + "x1y2z3w4" * 8 + " <|constrain|>json<|message|>{\"a\":1}<|call|>",
    " to=functions." + "a1b2c3d4" * 8 + "<|channel|>commentary json<|message|>{}<|call|>",
]


def _harmony_messages(enc, ids, strict):
    p = H.StreamableParser(enc, Role.ASSISTANT, strict=strict)
    for t in ids:
        p.process(t)
    p.process_eos()
    return [(m.author.role.value, m.channel, m.recipient, m.content_type, m.content[0].text) for m in p.messages]


def _ours(model, ids):
    p = harmony.HarmonyParser(model.tokenizer)
    deltas = [d for d in (p.feed(t) for t in ids) if d is not None]
    msgs = [(m.role, m.channel, m.recipient, m.content_type, m.text) for m in p.close()]
    return msgs, deltas


@pytest.mark.parametrize("text", WELL_FORMED)
def test_parser_equals_openai_harmony(tiny_model, text):
    enc = harmony_encoding()
    ids = _ids(enc, text)
    ours, deltas = _ours(tiny_model, ids)
    assert ours == _harmony_messages(enc, ids, strict=True)
    # the streamed deltas add up to each message's text, on the right channel
    for channel in {m[1] for m in ours}:
        assert "".join(d.text for d in deltas if d.channel == channel) == \
            "".join(m[4] for m in ours if m[1] == channel)


def test_parser_streams_split_code_points(tiny_model):
    """A character split over tokens arrives whole, once."""
    enc = harmony_encoding()
    ids = _ids(enc, "<|channel|>final<|message|>") + list(enc.encode("🦆".encode("utf-8").decode()))
    p = harmony.HarmonyParser(tiny_model.tokenizer)
    pieces = [d.text for d in (p.feed(t) for t in ids) if d is not None]
    assert "".join(pieces) == "🦆" and all(pieces)


MALFORMED = [
    "<|channel|>final<|message|>cut off in the mid",           # no end token: closed at end of generation
    "<|channel|>analysis<|message|>a<|end|>stray text with no start<|end|>",
    "<|channel|>final<|return|>",                              # a header that never reaches <|message|>
    "<|channel|>final some words<|end|>",
    "<|message|>no channel at all<|return|>",
    "<|channel|>analysis<|message|>x<|end|><|start|>mystery to=functions.f<|message|>y<|call|>",
    "<|channel|><|message|>empty channel<|end|>",
    "<|start|><|start|><|message|><|end|><|end|><|return|>",
    "<|channel|>final<|message|>\xff\xfe broken bytes<|return|>",
]


@pytest.mark.parametrize("text", MALFORMED)
def test_parser_survives_malformed_output(tiny_model, text):
    enc = harmony_encoding()
    ids = _ids(enc, text)
    ours, _ = _ours(tiny_model, ids)                          # never raises
    try:
        ref = _harmony_messages(enc, ids, strict=False)
    except H.HarmonyError:
        ref = None                                            # openai-harmony gives up; we still answer
    if ref is not None:
        assert [m[4] for m in ours] == [m[4] for m in ref]
        assert [m[1] for m in ours] == [m[1] for m in ref]


def _reply_of(model, text, tools=()):
    """The reply stream's reading of text's tokens, as the engine feeds them
    (it stops at <|call|> and <|return|> and never passes them on)."""
    from goosedump.reply import ReplyStream
    turn = ReplyStream(model.tokenizer, tools=tools)
    for t in _ids(harmony_encoding(), text):
        turn.feed(t)
    turn.close()
    return turn


def test_calls_to_other_recipients_stray_words_and_cut_headers(tiny_model):
    """What openai-harmony reads as a tool call never reaches the answer."""
    # a call to a tool the API does not serve (openai-harmony: recipient container.exec) is not the answer
    for text in ('<|channel|>commentary to=container.exec <|constrain|>json<|message|>{"cmd":["ls"]}',
                 '<|channel|>analysis to=browser.search code<|message|>{"query":"x"}'):
        turn = _reply_of(tiny_model, text)
        assert turn.content == "" and turn.reasoning == "" and not turn.tool_calls, text
    # a lone word after the channel, which openai-harmony reads as a recipient, is no tool: the answer stays
    assert _reply_of(tiny_model, '<|channel|>final <|constrain|>json<|message|>{"a":1}').content == '{"a":1}'
    assert _reply_of(tiny_model, "<|channel|>analysis markdown<|message|>thinking").reasoning == "thinking"
    assert _reply_of(tiny_model, "<|channel|>commentary to=assistant<|message|>Checking.").content == "Checking."
    # cut in a header with no recipient: its words are the answer, as at <|end|>
    assert _reply_of(tiny_model, "<|channel|>final The answer is 42").content == "The answer is 42"
    # a stray word in a call's header: still the call (the recipient wherever it stands)
    turn = _reply_of(tiny_model, "<|channel|>commentary to=functions.f <|constrain|>json extra<|message|>{}")
    assert [c["function"] for c in turn.tool_calls] == [{"name": "f", "arguments": "{}"}] and turn.content == ""
    # cut inside a call's header: an empty call cut short, no format text in the answer
    turn = _reply_of(tiny_model, "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant"
                                 "<|channel|>commentary to=functions.get_weather <|constrain|>json")
    assert turn.content == "" and turn.reasoning == "Need weather."
    assert [c["function"] for c in turn.tool_calls] == [{"name": "get_weather", "arguments": ""}]
    # a long tool name (a header of 70-odd tokens) is a call, not content
    name = "x1y2z3w4" * 8
    turn = _reply_of(tiny_model, f'<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{{"a":1}}')
    assert [c["function"] for c in turn.tool_calls] == [{"name": name, "arguments": '{"a":1}'}]
    assert turn.content == ""


def test_a_bare_recipient_that_names_a_declared_function_is_its_call(tiny_model):
    """gpt-oss sometimes writes to=NAME without functions. (vLLM met it in
    long contexts): openai-harmony reads NAME as the recipient, and where
    the request declares that function it is its call, not the answer nor
    the reasoning. A lone word that names no declared function (a content
    type: json, markdown) stays what it was."""
    weather = ("get_weather",)
    for channel in ("commentary", "analysis"):
        text = f'<|channel|>{channel} to=get_weather <|constrain|>json<|message|>{{"location":"Tokyo"}}'
        turn = _reply_of(tiny_model, text, weather)
        assert [c["function"] for c in turn.tool_calls] == [{"name": "get_weather", "arguments": '{"location":"Tokyo"}'}]
        assert turn.content == "" and turn.reasoning == "", channel
        p = harmony.HarmonyParser(tiny_model.tokenizer)
        for t in _ids(harmony_encoding(), text):
            p.feed(t)
        whole = reply.reply_from_messages(p.close(), weather)
        assert [c["function"]["name"] for c in whole.tool_calls] == ["get_weather"] and whole.content == ""
    undeclared = _reply_of(tiny_model, '<|channel|>commentary to=get_time<|message|>{}', weather)
    assert not undeclared.tool_calls
    assert _reply_of(tiny_model, "<|channel|>analysis markdown<|message|>thinking", weather).reasoning == "thinking"
    assert _reply_of(tiny_model, '<|channel|>final get_weather<|message|>{"a":1}', weather).content == '{"a":1}'


def test_a_header_after_start_that_never_reaches_message_keeps_its_role(tiny_model):
    """What follows <|start|> names its role; a message the model writes as
    someone else is dropped even when its header never reaches <|message|>
    (cut by the token limit, or ended at once): the role word and the
    tool's words had landed in the answer."""
    answer = "<|channel|>final<|message|>Hi!<|end|>"
    assert _reply_of(tiny_model, answer + "<|start|>user").content == "Hi!"
    assert _reply_of(tiny_model, answer + "<|start|>user some words<|end|>").content == "Hi!"
    assert _reply_of(tiny_model, answer + "<|start|>functions.get_weather to=assistant<|channel|>commentary "
                                          "tool output<|end|>").content == "Hi!"
    # the assistant's own header cut short still reads as before (its words the answer)
    assert _reply_of(tiny_model, answer + "<|start|>assistant<|channel|>final More").content == "Hi!More"
    long_run = " ".join(["user"] + ["words"] * 60)
    assert "words" not in _reply_of(tiny_model, answer + "<|start|>" + long_run).content
    # past the header's bound too: a tool's header, named or not, is a tool's (an unknown first word: its name)
    for head in ("functions.get_weather to=assistant<|channel|>commentary ", "functions.get_weather "):
        assert _reply_of(tiny_model, answer + "<|start|>" + head + "words " * 140).content == "Hi!", head


def test_reply_splits_channels_and_tool_calls(tiny_model):
    enc = harmony_encoding()
    ids = _ids(enc, WELL_FORMED[2])
    p = harmony.HarmonyParser(tiny_model.tokenizer)
    for t in ids:
        p.feed(t)
    r = reply.reply_from_messages(p.close())
    assert r.reasoning_content == "Use the tool."
    assert r.content == ""
    assert [c["function"] for c in r.tool_calls] == [{"name": "get_weather", "arguments": '{"location": "Tokyo"}'}]
    # and the reply goes back into the history as the renderer expects
    msgs = [{"role": "user", "content": "weather?"}, r.to_message(),
            {"role": "tool", "tool_call_id": r.tool_calls[0]["id"], "content": "sunny"}]
    text = tiny_model.tokenizer.decode(tiny_model.render_chat(msgs, tools=[WEATHER], date=DATE))
    assert "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny<|end|>" in text


# The format guide's structured-output example (openai/harmony docs/format.md,
# "Structured output"): the developer message as the model was trained on it.
GUIDE_SCHEMA = {"properties": {"items": {"type": "array", "description": "entries on the shopping list",
                                         "items": {"type": "string"}}}, "type": "object"}
GUIDE_DEVELOPER = ('<|start|>developer<|message|># Instructions\n\nYou are a helpful shopping assistant\n\n'
                   '# Response Formats\n\n## shopping_list\n\n{"properties":{"items":{"type":"array","description":'
                   '"entries on the shopping list","items":{"type":"string"}}},"type":"object"}<|end|>')


def developer_message(enc, ids) -> str:
    text = enc.decode(ids)
    start = text.index("<|start|>developer")
    return text[start:text.index("<|end|>", start) + len("<|end|>")]


def test_response_format_is_rendered_as_the_format_guide_writes_it(tiny_model):
    """A json_schema response format is named at the developer message's end
    ("# Response Formats"), as harmony's guide gives it: the text equals the
    guide's example, the ids equal openai-harmony's render of that text as
    instructions (it has no response-format field of its own), and the
    sampler still enforces the schema (test_structured)."""
    from goosedump.reply_plan import plan_reply
    enc = harmony_encoding()
    messages = [{"role": "system", "content": "You are a helpful shopping assistant"},
                {"role": "user", "content": "I need to buy coffee, soda and eggs"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "shopping_list", "schema": GUIDE_SCHEMA}}
    plan = plan_reply(tiny_model.tokenizer, response_format=fmt)
    ours = tiny_model.render_chat(messages, date=DATE, response_format=plan.response_format)
    assert developer_message(enc, ours) == GUIDE_DEVELOPER
    text = GUIDE_DEVELOPER[len("<|start|>developer<|message|># Instructions\n\n"):-len("<|end|>")]
    ref = enc.render_conversation_for_completion(Conversation.from_messages([
        Message.from_role_and_content(Role.SYSTEM, SystemContent.new().with_conversation_start_date(DATE)),
        Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new().with_instructions(text)),
        Message.from_role_and_content(Role.USER, messages[1]["content"])]), Role.ASSISTANT)
    assert ours == ref
    assert tiny_model.render_chat(messages, date=DATE, response_format=fmt) == ours     # OpenAI's form too
    # the same through Model.chat_stream (run -j, the chat REPL) and llama.cpp's json_schema field
    for kwargs in ({"response_format": fmt}, {"json_schema": GUIDE_SCHEMA}):
        stream = tiny_model.chat_stream(messages, max_tokens=1, date=DATE, **kwargs)
        list(stream)
        expected = GUIDE_DEVELOPER if "response_format" in kwargs else \
            GUIDE_DEVELOPER.replace("## shopping_list", "## response")
        assert developer_message(enc, stream.result.prompt_token_ids) == expected


def test_response_format_follows_the_tools_and_makes_a_developer_message(tiny_model):
    """With tools the format comes last ("at the end of the developer
    message"); a description is a // comment line; with no instructions or
    tools the format alone makes the developer message; JSON mode and
    grammars have no schema to name."""
    from goosedump.reply_plan import plan_reply
    enc = harmony_encoding()
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "count", "description": "How many.\nA whole number.",
                                                  "schema": schema}}
    user = [{"role": "user", "content": "How many?"}]
    plan = plan_reply(tiny_model.tokenizer, tools=[WEATHER], response_format=fmt)
    dev = developer_message(enc, tiny_model.render_chat(user, tools=plan.tools, response_format=plan.response_format))
    assert dev.endswith('} // namespace functions\n\n# Response Formats\n\n## count\n\n// How many.\n'
                        '// A whole number.\n{"type":"object","properties":{"n":{"type":"integer"}}}<|end|>'), dev
    flat = {"type": "json_schema", "name": " two\nwords ", "schema": schema}     # the Responses API's shape
    plan = plan_reply(tiny_model.tokenizer, response_format=flat)
    dev = developer_message(enc, tiny_model.render_chat(user, response_format=plan.response_format))
    assert dev == ('<|start|>developer<|message|># Response Formats\n\n## two words\n\n'
                   '{"type":"object","properties":{"n":{"type":"integer"}}}<|end|>')
    # a schema given as JSON text is written as the schema, not as a string
    text_schema = {"type": "json_schema", "json_schema": {"name": "count", "schema": json.dumps(schema)}}
    assert plan_reply(tiny_model.tokenizer, response_format=text_schema).response_format.schema == schema
    assert plan_reply(tiny_model.tokenizer, json_schema=json.dumps(schema)).response_format.schema == schema
    for kwargs in ({"response_format": {"type": "json_object"}}, {"grammar": 'root ::= "yes"'}, {}):
        assert plan_reply(tiny_model.tokenizer, **kwargs).response_format is None
    assert "developer" not in enc.decode(tiny_model.render_chat(user))


@pytest.mark.parametrize("generated, kept", [
    ("", ""),                                                            # stopped before its first token
    ("<|channel|>analysis", ""),                                         # in its first header
    ("<|channel|>analysis<|message|>Thinking", "<|channel|>analysis<|message|>Thinking"),
    ("<|channel|>analysis<|message|>Thinking<|end|>", "<|channel|>analysis<|message|>Thinking"),
    ("<|channel|>analysis<|message|>Thinking<|end|><|start|>assistant<|channel|>final",
     "<|channel|>analysis<|message|>Thinking"),
    ("Text of a model that writes no header", "Text of a model that writes no header"),   # the parser's text
    # a header that names a recipient stays a header longer (HEADER_LIMIT_NAMED): still cut
    ("<|channel|>analysis<|message|>Go.<|end|><|start|>assistant<|channel|>commentary to=functions.f "
     + "word " * 55, "<|channel|>analysis<|message|>Go."),
])
def test_an_interrupted_chat_answer_keeps_its_whole_messages(tiny_model, generated, kept):
    """The chat REPL keeps an interrupted answer's tokens for the next turn
    (they stay in the KV cache): without a header the interrupt cut before
    its <|message|>, and nothing at all where no message began, so that the
    next prompt is one openai-harmony reads (`<|start|>assistant<|end|>`
    is not: it had been kept after a Ctrl-C during the prefill)."""
    from goosedump.chat import TOKENS_KEY
    from goosedump.repl import interrupted_tokens
    enc = harmony_encoding()
    ids = interrupted_tokens(tiny_model.tokenizer, _ids(enc, generated))
    assert ids == _ids(enc, kept)
    history = [{"role": "user", "content": "hi"}]
    if ids:
        history.append({"role": "assistant", "content": "", TOKENS_KEY: ids})
    prompt = tiny_model.render_chat(history + [{"role": "user", "content": "again"}], date=DATE)
    if "<|message|>" in kept or not kept:     # (a model's text with no header stays as it wrote it)
        parsed = enc.parse_messages_from_completion_tokens(prompt[:-2], None)    # (the last: <|start|>assistant)
        assert [m.author.role.value for m in parsed][-2:] == (["assistant", "user"] if ids else ["user", "user"])
    else:
        assert enc.decode(prompt).count(kept) == 1
