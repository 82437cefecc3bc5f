"""`goosedump run` in the chat format and `goosedump chat` through a real
terminal (a pty)."""
import datetime
import fcntl
import io
import json
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time

import pytest

from goosedump.reply import Item, ReplyEvent
from goosedump.terminal import DIM, RESET, ReplyPrinter

DATE = "2025-06-28"


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "goosedump", *args], capture_output=True, text=True)


def test_run_renders_the_chat_format(tiny_path, tiny_model):
    out = run_cli("run", tiny_path, "-p", "Hello there", "--system", "Be brief.", "--date", DATE,
                  "--reasoning-effort", "high", "--temperature", "0", "-n", "6", "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    expect = tiny_model.render_chat([{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "Hello there"}],
                                    reasoning_effort="high", date=DATE)
    assert r["prompt_token_ids"] == expect
    text = tiny_model.tokenizer.decode(r["prompt_token_ids"])
    assert "Reasoning: high" in text and f"Current date: {DATE}" in text
    assert "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>" in text
    assert text.endswith("<|start|>user<|message|>Hello there<|end|><|start|>assistant")
    assert set(r["reply"]) == {"content", "reasoning_content", "tool_calls"}
    assert r["generated_tokens"] == 6 and r["stop_reason"] == "max_tokens"


def test_run_date_defaults_to_today_and_raw_skips_the_format(tiny_path, tiny_model):
    days = {datetime.date.today().isoformat()}
    out = run_cli("run", tiny_path, "-p", "Hi", "-n", "2", "--json")
    days.add(datetime.date.today().isoformat())          # (a run across midnight: either day)
    text = tiny_model.tokenizer.decode(json.loads(out.stdout)["prompt_token_ids"])
    assert any(f"Current date: {d}" in text for d in days)
    raw = run_cli("run", tiny_path, "-p", "Hi", "--raw", "-n", "2", "--json")
    assert json.loads(raw.stdout)["prompt_token_ids"] == tiny_model.tokenizer.encode("Hi")


def test_run_sampling_flags(tiny_path):
    def ids(*extra):
        out = run_cli("run", tiny_path, "-p", "Tell me a story", "-n", "12", "--json", *extra)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["token_ids"]
    a = ids("--seed", "5", "--top-p", "0.9", "--top-k", "50", "--min-p", "0.01")
    assert a == ids("--seed", "5", "--top-p", "0.9", "--top-k", "50", "--min-p", "0.01")
    assert a != ids("--seed", "6", "--top-p", "0.9", "--top-k", "50", "--min-p", "0.01")


@pytest.mark.parametrize("args,message", [
    (["-p", "x", "--raw", "--system", "s"], "--system needs the chat format"),
    (["-p", "x", "--date", "June 1st"], "--date must be a real date YYYY-MM-DD, got 'June 1st'"),
    (["-p", "x", "--top-p", "1.5"], "--top-p must be in [0, 1], got 1.5"),
    (["-p", "x", "--temperature", "-1"], "--temperature must be between 0 and 100, got -1.0"),
    (["--prompt-ids", "1,999999999"], "--prompt-ids: token id 999999999 is outside the vocabulary"),
])
def test_run_chat_errors(tiny_path, args, message):
    out = run_cli("run", tiny_path, *args)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def events(*items):
    """Reply events of whole items: (kind, tool name, text pieces) each."""
    out = []
    for n, (kind, name, pieces) in enumerate(items):
        item = Item(kind, n, 0, f"id{n}", name=name)
        out += [ReplyEvent("start", item)] + [ReplyEvent("delta", item, p) for p in pieces] + [ReplyEvent("end", item)]
    return out


def test_printer_dims_reasoning_and_names_tool_calls():
    out, err = io.StringIO(), io.StringIO()
    p = ReplyPrinter(out, err, show_reasoning=True, color=True)
    for ev in events(("reasoning", None, ["Think", "ing."]), ("content", None, ["Hello", " world"]),
                     ("tool_call", "weather", ['{"city":', '"Oslo"}'])):
        p(ev)
    p.finish()
    assert out.getvalue() == "Hello world"
    assert err.getvalue() == f"{DIM}Thinking.{RESET}\n[tool call] weather({{\"city\":\"Oslo\"}})\n"
    hidden_out, hidden_err = io.StringIO(), io.StringIO()
    q = ReplyPrinter(hidden_out, hidden_err, show_reasoning=False, color=True)
    for ev in events(("reasoning", None, ["secret"]), ("content", None, ["answer"])):
        q(ev)
    q.finish()
    assert hidden_out.getvalue() == "answer" and "secret" not in hidden_err.getvalue()


class Terminal:
    """A child process on a pseudo-terminal: what a user's terminal shows."""

    def __init__(self, argv):
        master, slave = pty.openpty()
        def controlling_terminal():   # a new session whose terminal is the pty: Ctrl-C becomes SIGINT
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                                     preexec_fn=controlling_terminal,
                                     env={**os.environ, "TERM": "dumb", "COLUMNS": "200"})
        os.close(slave)
        self.fd, self.screen = master, ""

    def read_until(self, text, timeout=60.0, start=0):
        end = time.monotonic() + timeout
        while text not in self.screen[start:]:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"waited {timeout} s for {text!r}; the terminal shows:\n{self.screen[-2000:]}")
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                try:
                    self.screen += os.read(self.fd, 65536).decode("utf-8", errors="replace")
                except OSError:   # the child closed the terminal
                    raise AssertionError(f"the program ended; the terminal shows:\n{self.screen[-2000:]}")
        return self.screen.index(text, start) + len(text)

    def read_more(self, chars, start, timeout=60.0):
        """Reads until chars characters show past start (an answer streaming)."""
        end = time.monotonic() + timeout
        while len(self.screen) < start + chars and time.monotonic() < end:
            r, _, _ = select.select([self.fd], [], [], 0.5)
            if r:
                self.screen += os.read(self.fd, 65536).decode("utf-8", errors="replace")
        assert len(self.screen) >= start + chars, f"waited {timeout} s for output:\n{self.screen[-2000:]}"

    def send(self, text):
        os.write(self.fd, text.encode())

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        os.close(self.fd)


def test_chat_in_a_terminal(tiny_path, tmp_path):
    term = Terminal([sys.executable, "-m", "goosedump", "chat", tiny_path, "--temperature", "0", "-n", "8",
                     "--date", DATE, "--profile"])
    try:
        at = term.read_until(">>> ")
        term.send("Hello!\r")
        at = term.read_until("stop: max_tokens]", start=at)
        at = term.read_until("where the time went", start=at)   # --profile: after each answer
        at = term.read_until("expert routing:", start=at)
        at = term.read_until(">>> ", start=at)
        term.send("/effort high\r")
        at = term.read_until("reasoning effort: high", start=at)
        term.send("And now?\r")
        at = term.read_until("cached)", start=at)
        # the second turn reused the first turn's cache
        cached = int(term.screen[:at].rsplit("(", 1)[1].split()[0])
        assert cached > 0
        saved = tmp_path / "conversation.json"
        term.send(f"/save {saved}\r")
        at = term.read_until("saved 4 messages", start=at)
        conv = json.loads(saved.read_text())
        assert conv["reasoning_effort"] == "high"
        assert [m["role"] for m in conv["messages"]] == ["user", "assistant", "user", "assistant"]
        assert conv["messages"][0]["content"] == "Hello!" and conv["messages"][2]["content"] == "And now?"
        term.send("/system Speak like a pirate.\r")
        at = term.read_until("system message: 'Speak like a pirate.'", start=at)
        term.send("/reset\r")
        at = term.read_until("conversation cleared", start=at)
        term.send("/nonsense\r")
        at = term.read_until("unknown command /nonsense", start=at)
        term.send("/quit\r")
        assert term.proc.wait(timeout=30) == 0
    finally:
        term.close()


def test_ctrl_c_stops_the_answer_not_the_chat(tiny_path):
    # A long sampled answer (no repetition stop), interrupted once it streams.
    term = Terminal([sys.executable, "-m", "goosedump", "chat", tiny_path, "--temperature", "1", "--seed", "1",
                     "-n", "3500", "--ctx", "4096"])
    try:
        at = term.read_until(">>> ")
        term.send("Write a very long essay.\r")
        term.read_more(400, at)                                             # the answer is streaming
        term.send("\x03")                                                   # Ctrl-C
        at = term.read_until("stop: interrupted]", start=at, timeout=30)
        at = term.read_until(">>> ", start=at)
        assert term.proc.poll() is None                                     # still chatting
        term.send("\x04")                                                   # Ctrl-D leaves
        assert term.proc.wait(timeout=30) == 0
    finally:
        term.close()


def test_ollamas_chat_commands(tiny_path, tmp_path):
    """/set parameter, /set format json, \"\"\" messages, /show, /load, /clear,
    /bye: what ollama users type, with the effects they expect (the greedy
    answer equal to `run`'s for the same message)."""
    term = Terminal([sys.executable, "-m", "goosedump", "chat", tiny_path, "--temperature", "1", "-n", "8",
                     "--date", DATE])
    saved, again = tmp_path / "conversation.json", tmp_path / "again.json"
    try:
        at = term.read_until(">>> ")
        for command, said in [("/set parameter temperature 0", "set temperature to 0"),
                              ("/set parameter num_predict 5", "set num_predict to 5"),
                              ("/set parameter top_k x", "top_k takes a whole number, got 'x'"),
                              ("/set parameter num_ctx 8192", "unknown parameter num_ctx"),
                              ("/show parameters", "temperature 0.0"),
                              ("/set system Be brief.", "system message: 'Be brief.'"),
                              ("/show system", "Be brief.")]:
            term.send(command + "\r")
            at = term.read_until(said, start=at)
        term.send('"""Hello\r')
        term.send('there!"""\r')
        at = term.read_until("[5 tokens", start=at)
        term.send("/set format json\r")
        at = term.read_until("answers are JSON objects", start=at)
        term.send("Name a colour.\r")
        at = term.read_until("stop:", start=at)
        term.send(f"/save {saved}\r")
        at = term.read_until("saved 5 messages", start=at)
        term.send("/clear\r")
        at = term.read_until("conversation cleared", start=at)
        term.send(f"/load {saved}\r")
        at = term.read_until("loaded 5 messages", start=at)
        term.send(f"/save {again}\r")
        at = term.read_until("saved 5 messages", start=at)
        term.send("/bye\r")
        assert term.proc.wait(timeout=30) == 0
    finally:
        term.close()
    conv = json.loads(saved.read_text())
    assert json.loads(again.read_text()) == conv
    system, user, answer, _, json_answer = conv["messages"]
    assert system == {"role": "system", "content": "Be brief."} and user["content"] == "Hello\nthere!"
    out = run_cli("run", tiny_path, "-p", "Hello\nthere!", "--system", "Be brief.", "--temperature", "0", "-n", "5",
                  "--date", DATE, "--json")
    assert answer["content"] == json.loads(out.stdout)["reply"]["content"]
    assert json_answer["content"].startswith("{")


def test_load_refuses_a_conversation_the_chat_cannot_render(tiny_model, tmp_path):
    """/load checks the saved conversation as the chat renders it: a bad one
    is named once and leaves the session as it was, not failing every turn."""
    from goosedump.repl import ChatSession
    err = io.StringIO()
    s = ChatSession(tiny_model, system=None, reasoning_effort="medium", date="2025-06-28", sampling=None,
                    max_tokens=2, show_reasoning=False, out=io.StringIO(), err=err)
    s.history = [{"role": "user", "content": "kept"}]
    for text, needle in (('{"messages": [{"role": "wizard", "content": "x"}]}', "wizard"),
                         ('[1, 2]', 'expected a JSON object with "messages"'),
                         ('{"messages": "hi"}', "not a list of messages")):
        path = tmp_path / "c.json"
        path.write_text(text)
        s.load(str(path))
        assert f"{path} is not a conversation /save wrote" in err.getvalue() and needle in err.getvalue(), \
            err.getvalue()
        assert s.history == [{"role": "user", "content": "kept"}]
        err.truncate(0)
        err.seek(0)
    path.write_text('{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}')
    s.load(str(path))
    assert "loaded 2 messages" in err.getvalue() and s.system == "be brief" and s.history[-1]["content"] == "hi"


def piped_chat(tiny_path, stdin: bytes, *args):
    # (stdin strict, as under a UTF-8 locale: the bytes must not end the chat there either)
    return subprocess.run([sys.executable, "-m", "goosedump", "chat", tiny_path, "--no-prompt-cache", "-n", "4",
                           "-t", "1", "--temperature", "0", *args], input=stdin, capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})


def test_piped_chat_survives_bad_bytes_and_sends_an_open_block(tiny_path, tmp_path):
    """Bytes that are not UTF-8 become U+FFFD as they are typed (they had
    reached /save as lone surrogates and ended the chat with a half-written
    file); piped in, no prompts reach stdout; a \"\"\" block the input ends
    inside is sent, not dropped."""
    saved = tmp_path / "nb.json"
    out = piped_chat(tiny_path, b"\xff\xfe bad\n/save " + str(saved).encode() + b'\nstill alive\n"""open\nblock\n')
    assert out.returncode == 0, out.stderr
    err = out.stderr.decode()
    assert "Traceback" not in err and err.count(" tokens, ") == 3, err     # three answers
    messages = json.loads(saved.read_text(encoding="utf-8"))["messages"]
    assert messages[0]["content"] == "\ufffd\ufffd bad"
    assert b">>> " not in out.stdout and b"... " not in out.stdout


def session(model, **kw):
    from goosedump.repl import ChatSession
    err = io.StringIO()
    kw = {"system": None, "reasoning_effort": "medium", "date": "2025-06-28", "sampling": None, "max_tokens": 4,
          "show_reasoning": False, "out": io.StringIO(), "err": err, **kw}
    return ChatSession(model, **kw), err


def test_a_full_conversation_says_clear_and_goes_on(tiny_path):
    """A conversation past the context: one line naming /clear (it had
    advised --ctx and --max-tokens, neither of which the chat can change),
    and the answer takes what the context leaves."""
    import goosedump
    from goosedump.sampling import SamplingParams
    model = goosedump.load(tiny_path, n_ctx=200)
    s, err = session(model, sampling=SamplingParams(temperature=0), max_tokens=40)
    for i in range(12):
        s.ask(f"Tell me about item number {i} please")
        if "the conversation is full" in err.getvalue():
            break
    assert "/clear to start over" in err.getvalue() and "--max-tokens" not in err.getvalue()
    kept = len(s.history)
    s.command("/clear")
    s.ask("Hello again")
    assert len(s.history) == 2 < kept and s.history[-1]["role"] == "assistant"
    model.close()


def test_fit_context_clamps_the_answer_to_the_room_left(tiny_path):
    """chat_stream(fit_context=True), as the chat runs its turns: the answer
    takes at most what the rendered prompt leaves; without it a prompt and
    max_tokens past the context are refused, as the server refuses them."""
    import goosedump
    from goosedump.result import ContextOverflowError
    from goosedump.sampling import SamplingParams
    model = goosedump.load(tiny_path, n_ctx=200)
    greedy = SamplingParams(temperature=0)
    words = "word " * 10
    while len(model.render_chat([{"role": "user", "content": words}])) < 190:
        words += "word "
    msgs = [{"role": "user", "content": words}]
    room = 200 - len(model.render_chat(msgs))
    with pytest.raises(ContextOverflowError):
        model.chat(msgs, 40, sampling=greedy)
    r = model.chat(msgs, 40, sampling=greedy, fit_context=True).result
    assert r.prompt_tokens == 200 - room and r.generated_tokens <= room
    assert r.stop_reason in ("max_tokens", "eos") and (r.stop_reason == "eos" or r.generated_tokens == room)
    model.close()


def test_save_and_load_edge_cases(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    s, err = session(tiny_model)
    s.command("/save ~/empty.json")                      # (~ is the home folder)
    assert (tmp_path / "empty.json").exists()
    s.command("/load ~/empty.json")                      # an empty conversation loads back
    assert "loaded 0 messages" in err.getvalue(), err.getvalue()
    s.command("/load")
    assert "usage: /load FILE" in err.getvalue()
    bad = tmp_path / "ids.json"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                            {"role": "assistant", "goosedump_token_ids": [10 ** 9]}]}))
    s.command(f"/load {bad}")
    assert "holds ids outside the vocabulary" in err.getvalue()
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(65 << 20)                             # sparse: refused by its size, never read
    s.command(f"/load {big}")
    assert "more than 64 MiB" in err.getvalue()
    parts = tmp_path / "parts.json"
    parts.write_text(json.dumps({"messages": [{"role": "system", "content": [{"type": "text", "text": "hi"}]}]}))
    s.command(f"/load {parts}")
    assert s.system == "hi"
    assert "Traceback" not in err.getvalue()


def test_a_vanishing_temperature_is_greedy(tiny_path):
    """x / T overflowed for T = 5e-324 and the sampler's NaNs picked token
    n_vocab (a traceback)."""
    base = ["run", tiny_path, "-p", "Hi", "-n", "4", "--json", "--no-prompt-cache"]
    tiny = run_cli(*base, "--temperature", "5e-324")
    assert tiny.returncode == 0, tiny.stderr
    greedy = run_cli(*base, "--temperature", "0")
    assert json.loads(tiny.stdout)["token_ids"] == json.loads(greedy.stdout)["token_ids"]


def test_chat_p_is_a_first_message_as_in_llama_cli(tiny_path, tmp_path):
    """llama-cli's -p in its conversation mode: the first message, answered,
    then the chat goes on (it was an unknown flag); its escapes read as -p's."""
    saved = tmp_path / "c.json"
    out = piped_chat(tiny_path, b"and then?\n/save " + str(saved).encode() + b"\n", "-p", r"Hello\nthere")
    assert out.returncode == 0, out.stderr
    assert out.stderr.decode().count(" tokens, ") == 2          # two answers
    users = [m["content"] for m in json.loads(saved.read_text())["messages"] if m["role"] == "user"]
    assert users == ["Hello\nthere", "and then?"]
    # the same first answer as the same message typed as the first line
    typed = piped_chat(tiny_path, b"Hello\n")
    first = piped_chat(tiny_path, b"", "-p", "Hello")
    assert first.stdout == typed.stdout and first.returncode == 0
