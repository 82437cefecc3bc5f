"""ollama's spellings on the command line: --think (alone, =level, =false),
--hidethinking, --format json and --verbose, each equal to goosedump's own
flag it stands for (the same prompt and tokens), and their misuses named."""
import io
import json
import re
import sys

import pytest

from test_chat_cli import Terminal
from test_cli_habits import cli, fail

PROMPT = "Why is the sky blue?"
BASE = ("-n", "6", "--temp", "0", "--json", "--date", "2025-06-28")


def run(tiny_path, *args) -> dict:
    out = cli("run", tiny_path, *BASE, *args)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    return {"prompt": r["prompt_token_ids"], "tokens": r["token_ids"]}


def test_each_spelling_is_the_flag_it_stands_for(tiny_path):
    plain = run(tiny_path, PROMPT)
    # a bare --think takes no value: the word after it is the prompt's, as ollama reads it
    assert run(tiny_path, "--think", PROMPT) == plain == run(tiny_path, "--think=true", PROMPT)
    assert run(tiny_path, "--think=high", PROMPT) == run(tiny_path, "--reasoning-effort", "high", PROMPT) != plain
    assert run(tiny_path, "--think=false", PROMPT) == run(tiny_path, "--reasoning-budget", "0", PROMPT)
    # --think false (a space): ollama reads 'false' as the prompt's; so does goosedump, and says so
    spaced = cli("run", tiny_path, *BASE, "--think", "false", PROMPT)
    assert spaced.returncode == 0 and "--think takes its value after '=' (--think=false)" in spaced.stderr
    assert json.loads(spaced.stdout)["prompt_token_ids"] == run(tiny_path, "false " + PROMPT)["prompt"]
    # --format json is JSON mode (ollama's format "json", OpenAI's json_object): no schema in the prompt, where
    # -j names its schema in the developer message
    json_mode, schema = run(tiny_path, "--format", "json", PROMPT), run(tiny_path, "-j", '{"type": "object"}', PROMPT)
    assert json_mode["prompt"] == plain["prompt"] and len(schema["prompt"]) > len(plain["prompt"])


@pytest.mark.parametrize("flag,shown", [(None, True), ("--hide-reasoning", False), ("--hidethinking", False)])
def test_hiding_the_reasoning_reaches_the_printer(tiny_path, monkeypatch, flag, shown):
    """The tiny model's random tokens carry no channel header, so its reply
    holds no reasoning: each run's own printer (the one `run` made from its
    flags) is handed a reasoning item and an answer after the reply."""
    from goosedump import cli as cli_module, commands
    from test_chat_cli import events
    real = commands.print_reply
    printers = []

    def print_reply(stream, printer, interruptible=False):
        real(stream, printer, interruptible)
        printers.append(printer)
        printer.out, printer.err = io.StringIO(), io.StringIO()
        for ev in events(("reasoning", None, ["secret-thought"]), ("content", None, ["the-answer"])):
            printer(ev)
        printer.finish()
    monkeypatch.setattr(commands, "print_reply", print_reply)
    argv = ["run", tiny_path, "-n", "3", "--temp", "0", "--no-prompt-cache", *([flag] if flag else []), PROMPT]
    assert cli_module.main(argv) == 0
    (p,) = printers
    assert p.out.getvalue() == "the-answer"
    assert ("secret-thought" in p.err.getvalue()) == shown, p.err.getvalue()


def test_verbose_prints_ollamas_timings(tiny_path):
    out = cli("run", tiny_path, "-n", "5", "--temp", "0", "--verbose", PROMPT)
    assert out.returncode == 0, out.stderr
    names = [n for n in re.findall(r"^([a-z ]+):\s+\S", out.stderr, re.M) if n != "goosedump"]
    assert names == ["total duration", "load duration", "prompt eval count", "prompt eval duration",
                     "prompt eval rate", "eval count", "eval duration", "eval rate"]
    assert re.search(r"^eval count:\s+5 token\(s\)$", out.stderr, re.M)
    total = re.search(r"^total duration:\s+([\d.]+)(m?s)$", out.stderr, re.M)
    assert total and float(total.group(1)) > 0


def test_verbose_in_the_chat(tiny_path):
    term = Terminal([sys.executable, "-m", "goosedump", "chat", tiny_path, "--temp", "0", "-n", "4", "--verbose"])
    try:
        at = term.read_until(">>> ")
        term.send("Hello!\r")
        at = term.read_until("eval rate:", start=at)
        term.read_until(">>> ", start=at)
        term.send("/quit\r")
    finally:
        term.close()


@pytest.mark.parametrize("args,needles", [
    (("--think=max", PROMPT), ("--think", "invalid choice: 'max'")),
    (("--think=false", "--reasoning-budget", "5", PROMPT), ("--think=false", "--reasoning-budget 5")),
    (("--format", "json", "-j", "{}", PROMPT), ("--format json", "-j/--json-schema")),
    (("--format", "yaml", PROMPT), ("--format", "invalid choice: 'yaml'")),
])
def test_misuses_are_named(tiny_path, args, needles):
    fail(cli("run", tiny_path, *args), *needles)
