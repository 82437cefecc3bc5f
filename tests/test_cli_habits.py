"""What users coming from llama.cpp and ollama type, and the rough edges a
new user met (issue 18), each run through the installed `goosedump` command."""
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from goosedump import synth

from test_chat_cli import Terminal
from test_server import free_port, httpx

GOOSEDUMP = shutil.which("goosedump", path=os.path.dirname(sys.executable)) or shutil.which("goosedump")


def cli(*args, stdin="", env=None, timeout=300):
    assert GOOSEDUMP, "the goosedump command is not installed beside this Python"
    return subprocess.run([GOOSEDUMP, *args], capture_output=True, text=True, input=stdin, timeout=timeout,
                          env={**os.environ, **(env or {})})


def ids_of(out):
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["token_ids"]


def fail(out, *needles):
    """One error line that names what the user typed, no traceback."""
    assert out.returncode != 0, out.stdout
    assert "Traceback" not in out.stderr, out.stderr
    for n in needles:
        assert n in out.stderr, out.stderr
    return out.stderr


@pytest.fixture(scope="module")
def streamed_120b(tmp_path_factory, small_vocab):
    """tiny-120b (36 layers x 128 experts) with a skewed router, so that a
    small expert cache both hits and misses."""
    path = tmp_path_factory.mktemp("models") / "tiny-120b.gguf"
    synth.write_model(path, "tiny-120b", seed=3, vocab=small_vocab, routing="skewed")
    return os.fspath(path)


# --- 1. llama.cpp's flags ----------------------------------------------------------

def test_llamacpp_spellings_give_the_same_run(tiny_path, tmp_path):
    ours = ids_of(cli("run", tiny_path, "-p", "Tell me a story", "--ctx", "512", "--threads", "1", "--seed", "3",
                      "--temperature", "0.8", "--repetition-penalty", "1.3", "--max-tokens", "10", "--json"))
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Tell me a story")
    theirs = ids_of(cli("run", "-m", tiny_path, "-f", str(prompt), "-c", "512", "-t", "1", "-s", "3",
                        "--temp", "0.8", "--repeat-penalty", "1.3", "--n-predict", "10", "--json"))
    assert ours == theirs and len(ours) == 10
    # the repetition penalty is applied, not only accepted
    assert ids_of(cli("run", tiny_path, "-p", "Tell me a story", "-s", "3", "--temp", "0.8", "-n", "10",
                      "--json")) != ours


def test_seed_minus_one_is_a_random_seed(tiny_path):
    a = ids_of(cli("run", tiny_path, "-p", "Hi", "-s", "-1", "-n", "12", "--json"))
    b = ids_of(cli("run", tiny_path, "-p", "Hi", "-s", "-1", "-n", "12", "--json"))
    assert a != b
    fail(cli("run", tiny_path, "-p", "Hi", "-s", "-2"), "-s/--seed", "-2")


def test_n_predict_minus_one_runs_to_the_end_of_the_context(tiny_path):
    out = cli("run", tiny_path, "--raw", "-p", "Once upon a time", "-n", "-1", "-c", "64", "--temp", "1", "-s", "1",
              "--json")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["prompt_tokens"] + r["generated_tokens"] <= 64
    assert r["stop_reason"] == "eos" or r["prompt_tokens"] + r["generated_tokens"] == 64, r["stop_reason"]


def test_bench_comma_lists_give_one_row_per_combination(tiny_path):
    out = cli("bench", tiny_path, "-p", "8,16", "-n", "2,4", "-t", "1,2", "-r", "1", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    combos = [(r["threads"], r["prompt_tokens"], r["gen_tokens"]) for r in doc["results"]]
    assert combos == list(itertools.product([1, 2], [8, 16], [2, 4]))
    # size and params: the tensors' bytes and elements, as gguf-py reads them
    from gguf import GGUFReader
    tensors = GGUFReader(tiny_path).tensors
    assert doc["size_bytes"] == sum(int(t.n_bytes) for t in tensors)
    assert doc["params"] == sum(int(t.n_elements) for t in tensors) and doc["backend"].startswith("CPU")
    table = cli("bench", tiny_path, "-p", "8", "-n", "2", "-t", "1,2", "-r", "1")
    assert table.returncode == 0, table.stderr
    head, _, *rows = [line for line in table.stdout.splitlines() if line.startswith("|")]
    assert [c.strip() for c in head.strip("|").split("|")] == ["model", "size", "params", "backend", "threads",
                                                               "test", "t/s"]
    assert [(r.split("|")[5].strip(), r.split("|")[6].strip()) for r in rows] == \
        [("1", "pp8"), ("1", "tg2 @ d8"), ("2", "pp8"), ("2", "tg2 @ d8")]
    fail(cli("bench", tiny_path, "-p", "8,x"), "-p/--prompt-tokens", "8,x")
    # lists as llama-bench's: a ppP row once per P (not once per -n), a tgN row per pair named by the depth it
    # decodes at, and -p 0 for decode from (nearly) empty, as llama-bench's tgN
    table = cli("bench", tiny_path, "-p", "0,8", "-n", "0,2", "-r", "1")
    assert table.returncode == 0, table.stderr
    rows = [line for line in table.stdout.splitlines() if line.startswith("|")][2:]
    assert [r.split("|")[6].strip() for r in rows] == ["tg2", "pp8", "tg2 @ d8"]
    fail(cli("bench", tiny_path, "-p", "0", "-n", "0"), "-p 0 with -n 0 times nothing")


def test_bench_tg_counts_forward_passes_as_llama_bench(tiny_path):
    # tgN times N one-token forward passes after the prefill (llama-bench's
    # tg1 is one); -n 0 times the prefill alone and prints no tg row
    out = cli("bench", tiny_path, "-p", "8", "-n", "0,1,3", "-r", "1", "--json", "--profile")
    assert out.returncode == 0, out.stderr
    none, one, three = json.loads(out.stdout)["results"]
    assert none["decode_tokens_per_s"] is None and none["prefill_tokens_per_s"] > 0
    assert one["decode_tokens_per_s"] > 0 and three["decode_tokens_per_s"] > 0
    assert [len(r["profile"]["decode_tokens"]) for r in (none, one, three)] == [0, 1, 3]
    table = cli("bench", tiny_path, "-p", "8", "-n", "0", "-r", "1")
    assert table.returncode == 0, table.stderr
    head, _, *rows = [line for line in table.stdout.splitlines() if line.startswith("|")]
    assert [r.split("|")[6].strip() for r in rows] == ["pp8"]
    fail(cli("bench", tiny_path, "-n", "-1"), "-n/--gen-tokens must be at least 0", "-1")


# --- 2. ollama's -------------------------------------------------------------------

def test_positional_prompt_and_piped_stdin(tiny_path):
    flag = ids_of(cli("run", tiny_path, "-p", "Hello there", "--temp", "0", "-n", "4", "--json"))
    assert ids_of(cli("run", tiny_path, "Hello", "there", "--temp", "0", "-n", "4", "--json")) == flag
    assert ids_of(cli("run", tiny_path, "Hello there", "--temp", "0", "-n", "4", "--json")) == flag
    assert ids_of(cli("run", tiny_path, "--temp", "0", "-n", "4", "--json", stdin="Hello there")) == flag
    # flags between the model and the prompt, or between the prompt's words
    assert ids_of(cli("run", tiny_path, "--temp", "0", "-n", "4", "--json", "Hello there")) == flag
    assert ids_of(cli("run", tiny_path, "Hello", "--temp", "0", "-n", "4", "there", "--json")) == flag
    other = ids_of(cli("run", tiny_path, "-p", "there Hello", "--temp", "0", "-n", "4", "--json"))
    assert ids_of(cli("run", tiny_path, "--temp", "0", "there", "-n", "4", "Hello", "--json")) == other
    fail(cli("run", tiny_path, "words", "-p", "flag"), "give one prompt")
    # text piped beside the words goes before them, joined by a space, as ollama joins them
    # (`cat notes.txt | ollama run MODEL "summarize"`); it had been dropped without a word
    joined = ids_of(cli("run", tiny_path, "-p", "Paris is big.\n summarize", "--no-escape", "--temp", "0", "-n", "4",
                        "--json"))
    assert ids_of(cli("run", tiny_path, "summarize", "--temp", "0", "-n", "4", "--json",
                      stdin="Paris is big.\n")) == joined != flag


def test_ollama_words_and_shell_habits(tiny_path):
    """`goosedump` alone prints what it can do; ollama's ls and show; a
    reader that stops early (`| head`) ends the run quietly (141, as a
    shell's tools end), not with an error."""
    alone = cli()
    assert alone.returncode == 2 and "describe a model file" in alone.stderr and "Traceback" not in alone.stderr
    fail(cli("--bogus"), "unrecognized arguments: --bogus")
    shown, inspected = cli("show", tiny_path, "--json"), cli("inspect", tiny_path, "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["tensors"] == json.loads(inspected.stdout)["tensors"]
    assert cli("ls").returncode == 0
    proc = subprocess.Popen([GOOSEDUMP, "run", tiny_path, "-p", "hi", "--raw", "-n", "200", "--temp", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(3)
    proc.stdout.close()                      # the reader had enough
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141 and "Broken pipe" not in err and "Traceback" not in err, err


def test_a_stdin_held_open_and_silent_is_said_not_waited_on(tiny_path):
    """A parent that holds stdin open and sends nothing (a script's
    subprocess): the words are the prompt after a short wait, said."""
    proc = subprocess.Popen([GOOSEDUMP, "run", tiny_path, "Hello", "there", "--temp", "0", "-n", "4", "--json"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t = time.monotonic()          # (no communicate(): it would close stdin)
    while proc.poll() is None and time.monotonic() - t < 120:
        time.sleep(0.1)
    out, err = proc.stdout.read(), proc.stderr.read()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        f.close()
    assert proc.returncode == 0, err
    assert "stdin is not a terminal but sent nothing in 2 s: not read" in err
    assert json.loads(out)["token_ids"] == ids_of(cli("run", tiny_path, "-p", "Hello there", "--temp", "0", "-n", "4",
                                                      "--json"))


def test_run_without_a_prompt_on_a_terminal_opens_the_chat(tiny_path):
    term = Terminal([GOOSEDUMP, "run", tiny_path, "--temp", "0", "-n", "4"])
    try:
        at = term.read_until(">>> ")
        term.send("Hello!\r")
        at = term.read_until("stop: max_tokens]", start=at)
        term.read_until(">>> ", start=at)
        term.send("\x04")
        assert term.proc.wait(timeout=30) == 0
    finally:
        term.close()


def test_serve_defaults_to_the_model_run_uses(tiny_path, tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([GOOSEDUMP, "serve", "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "GOOSEDUMP_MODEL": tiny_path})
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
                    models = json.load(r)
                break
            except OSError:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.5)
        assert [m["id"] for m in models["data"]] == ["tiny"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- 3. help -----------------------------------------------------------------------

SUBCOMMANDS = ["run", "chat", "serve", "bench", "inspect", "pull", "list", "synth", "plot", "cache-sim", "demo"]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help_describes_every_flag(command):
    from goosedump.cli import build_parser
    _, subs = build_parser()
    p = subs[command]
    undocumented = [a.option_strings or a.dest for a in p._actions if not a.help and a.dest != "help"]
    assert not undocumented, f"{command}: flags without help: {undocumented}"
    out = cli(command, "--help")
    assert out.returncode == 0 and out.stdout.startswith(f"usage: goosedump {command}")
    for a in p._actions:        # each flag's every spelling is in the printed help
        for s in a.option_strings:
            assert s in out.stdout, f"{command} --help does not show {s}"


def test_help_says_what_users_ask():
    synth_help = " ".join(cli("synth", "--help").stdout.split())
    assert "12.1 GB" in synth_help and "65 GB" in synth_help and "--seed" in synth_help
    serve_help = cli("serve", "--help").stdout
    assert "/v1/chat/completions" in serve_help and "/v1/responses" in serve_help and "docs/" not in serve_help
    assert "0: one per core" in cli("run", "--help").stdout
    demo = cli("demo", "--help").stdout
    assert "--max-tokens" in demo and "--threads" in demo
    assert "--json" in cli("cache-sim", "--help").stdout


@pytest.mark.parametrize("command", ["run", "bench", "synth", "cache-sim"])
def test_unknown_flag_prints_the_subcommands_usage(command):
    out = cli(command, "--no-such-flag")
    assert out.returncode == 2
    assert out.stderr.startswith(f"usage: goosedump {command}") and "--no-such-flag" in out.stderr


# --- 4, 5. errors name the flag; values are checked --------------------------------------

@pytest.mark.parametrize("args,needles", [
    (["-n", "0"], ["-n/--max-tokens", "got 0"]),
    (["-c", "-1"], ["-c/--ctx", "got -1"]),
    (["--ctx", "10000000"], ["-c/--ctx 10000000", "context length"]),
    (["--top-p", "-0.5"], ["--top-p", "[0, 1]"]),
    (["--temperature", "-1"], ["--temperature"]),
    (["--repeat-penalty", "0"], ["--repetition-penalty"]),
    (["--seed", "-7"], ["-s/--seed", "-7"]),
    (["--date", "2026-13-01"], ["--date", "2026-13-01"]),
    (["--date", "June 1st"], ["--date", "June 1st"]),
    (["-t", "-3"], ["-t/--threads", "-3"]),
    (["--logit-bias", "12+x"], ["--logit-bias", "12+x"]),
    (["--logit-bias", "999999+1"], ["--logit-bias", "999999"]),
])
def test_errors_name_the_flag(tiny_path, args, needles):
    err = fail(cli("run", tiny_path, "-p", "x", *args), *needles)
    assert "max_tokens" not in err and "n_ctx" not in err and len(err.strip().splitlines()) == 1


def test_a_missing_or_binary_prompt_file_and_a_port_out_of_range_are_named(tiny_path, tmp_path):
    fail(cli("run", tiny_path, "-f", str(tmp_path / "none.txt")), f"-f/--file {tmp_path / 'none.txt'}",
         "No such file")
    binary = tmp_path / "prompt.bin"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    fail(cli("run", tiny_path, "-f", str(binary)), f"-f/--file {binary}", "not UTF-8")
    # the schema and grammar files alike
    fail(cli("run", tiny_path, "hi", "-j", str(tmp_path / "none.json")),
         f"-j/--json-schema {tmp_path / 'none.json'}: not a file (No such file", "nor a JSON object")
    fail(cli("run", tiny_path, "hi", "-j", str(binary)), f"-j/--json-schema {binary}", "not UTF-8")
    fail(cli("run", tiny_path, "hi", "--grammar", str(tmp_path / "none.gbnf")),
         f"--grammar {tmp_path / 'none.gbnf'}", "No such file")
    fail(cli("run", tiny_path, "hi", "--grammar", str(binary)), f"--grammar {binary}", "not UTF-8")
    fail(cli("serve", tiny_path, "--port", "99999"), "--port", "99999", "65535")


def test_threads_above_the_cores_warn(tiny_path):
    many = (os.cpu_count() or 1) + 1
    out = cli("run", tiny_path, "-p", "x", "-n", "1", "-t", str(many), "--json")
    assert out.returncode == 0 and f"-t/--threads {many} is more than this machine's" in out.stderr


# --- 7. output hygiene --------------------------------------------------------------------

def test_profile_message_has_its_own_line(tiny_path, tmp_path):
    out = cli("run", tiny_path, "-p", "Hi", "-n", "3", "--profile-out", str(tmp_path / "p.json"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.endswith("\n")
    assert f"profile written to {tmp_path / 'p.json'}" in out.stderr.splitlines()


def test_demo_ends_its_answer_with_a_newline_when_piped(tmp_path):
    out = cli("demo", "-n", "4", "-t", "1", env={"XDG_CACHE_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.endswith("\n") and "stop:" in out.stderr
    # -n 0 is refused before the model is written (it had been refused after the prompt was printed)
    empty = tmp_path / "empty"
    fail(cli("demo", "-n", "0", env={"XDG_CACHE_HOME": str(empty)}), "-n/--max-tokens", "got 0")
    assert not empty.exists()


def test_ctrl_c_shows_one_stop_reason_and_keeps_the_answer_in_the_cache(tiny_path):
    term = Terminal([GOOSEDUMP, "chat", tiny_path, "--temperature", "1", "--seed", "1", "-n", "3500",
                     "--ctx", "4096"])
    try:
        at = term.read_until(">>> ")
        term.send("Write a very long essay.\r")
        at = term.read_until("\n", start=at)
        term.read_more(200, at)                                             # the answer is streaming
        term.send("\x03")
        end = term.read_until("stop: interrupted]", start=at, timeout=30)
        line = term.screen[:end].rsplit("[", 1)[1]
        n, prompt = map(int, re.match(r"(\d+) tokens, [\d.]+ tok/s, prompt (\d+)", line).groups())
        after = term.screen[end:end + 40]
        assert "[stopped]" not in after and "stop:" not in after
        at = term.read_until(">>> ", start=end)
        term.send("Go on.\r")
        at = term.read_until("\n", start=at)
        term.read_more(200, at)
        term.send("\x03")                                                   # this one too
        at = term.read_until("cached)", start=at, timeout=60)
        cached = int(term.screen[:at].rsplit("(", 1)[1].split()[0])
        # the interrupted answer was not prefilled again: all of it but its
        # last token (sampled, never fed back) came from the cache
        assert cached >= prompt + n - 1, (cached, prompt, n)
        term.read_until(">>> ", start=at, timeout=60)
        term.send("\x04")
        assert term.proc.wait(timeout=30) == 0
    finally:
        term.close()


# --- 8. numbers that agree ------------------------------------------------------------------

def test_in_memory_experts_say_so(tiny_path):
    out = cli("run", tiny_path, "-p", "Hi", "-n", "3", "--json")
    cache = json.loads(out.stdout)["expert_cache"]
    assert cache["in_place"] is True and cache["hit_rate"] == 1.0
    text = cli("run", tiny_path, "-p", "Hi", "-n", "3", "--profile")
    assert "experts: in memory" in text.stderr


def test_cache_figures_agree_and_belady_bounds_the_demand_rate(streamed_120b, tmp_path):
    out = cli("run", streamed_120b, "--raw", "-p", "The quick brown fox jumps over the lazy dog " * 3, "-n", "24",
              "--temp", "0", "--expert-cache", "2M", "--profile", "--json", "--profile-out", str(tmp_path / "p.json"))
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    cache, phases = r["expert_cache"], r["profile"]["phases"]
    assert cache["misses"] > 0 and cache["hits"] > 0
    # the summary covers prefill and decode; the phases add up to it
    assert cache["hits"] == phases["prefill"]["expert_cache"]["hits"] + phases["decode"]["expert_cache"]["hits"]
    assert cache["misses"] == phases["prefill"]["expert_cache"]["misses"] + \
        phases["decode"]["expert_cache"]["misses"]
    # the picture's title: the decode phase's figures, per token summed
    tokens = r["profile"]["decode_tokens"]
    assert sum(t["hits"] for t in tokens) == phases["decode"]["expert_cache"]["hits"]
    assert sum(t["misses"] for t in tokens) == phases["decode"]["expert_cache"]["misses"]
    # Belady's oracle on the store's own requests bounds what any demand-only cache achieves
    assert cache["demand_hit_rate"] <= cache["belady_hit_rate"] + 1e-12, cache
    assert cache["demand_hit_rate"] == pytest.approx((cache["hits"] - cache["prefetch_used"]) /
                                                     (cache["hits"] + cache["misses"]))
    text = cli("run", streamed_120b, "--raw", "-p", "The quick brown fox", "-n", "8", "--expert-cache", "2M",
               "--profile", "-s", "1")
    assert "expert cache over prefill and decode" in text.stderr


def test_readme_slot_size_is_what_inspect_says(streamed_120b):
    with open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8") as f:
        readme = f.read()
    m = re.search(r"tiny-120b`?\s+\(36 layers\s+x\s+128 experts,\s+([\d.]+ [KMG]iB) slots", readme)
    assert m, "the README states tiny-120b's expert slot size"
    out = cli("inspect", streamed_120b, "--json")
    from goosedump.budget import format_bytes
    assert format_bytes(json.loads(out.stdout)["expert_slot_bytes"]) == m.group(1)


# --- 9. cache-sim ----------------------------------------------------------------------

def test_cache_sim_refuses_what_is_not_a_trace(tiny_path, tmp_path):
    fail(cli("cache-sim", tiny_path), tiny_path, "GGUF", "--routing-trace")
    junk = tmp_path / "junk.txt"
    junk.write_text("hello\n")
    fail(cli("cache-sim", str(junk)), str(junk), "--routing-trace")
    empty = tmp_path / "empty.jsonl"
    trace = tmp_path / "t.jsonl"
    assert cli("run", tiny_path, "-p", "Hi", "-n", "2", "--routing-trace", str(trace)).returncode == 0
    empty.write_text(trace.read_text().splitlines()[0] + "\n")      # the header alone
    fail(cli("cache-sim", str(empty)), str(empty), "no routing requests")


def test_cache_sim_default_budgets_scale_to_the_model(tiny_path, tmp_path):
    trace = tmp_path / "t.jsonl"
    assert cli("run", tiny_path, "-p", "Hi there", "-n", "16", "--routing-trace", str(trace)).returncode == 0
    doc = json.loads(cli("cache-sim", str(trace), "--json").stdout)
    experts = 4 * 8                         # the tiny preset: 4 layers x 8 experts
    assert [r["slots"] for r in doc["results"]] == [experts // 8, experts // 4, experts // 2]
    rates = [r["lru"] for r in doc["results"]]
    assert rates == sorted(rates) and rates[0] < rates[-1]


# --- 10. small ones --------------------------------------------------------------------

def test_synth_into_a_missing_folder_fails_first(tmp_path):
    out = cli("synth", "--preset", "tiny", "--out", str(tmp_path / "nope" / "m.gguf"))
    err = fail(out, "--out", str(tmp_path / "nope"))
    assert len(err.strip().splitlines()) == 1 and "%" not in err


def test_serve_on_port_0_names_the_port_it_got(tiny_path):
    proc = subprocess.Popen([GOOSEDUMP, "serve", tiny_path, "--port", "0", "--log-level", "warning"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = next(ln for ln in proc.stderr if ln.startswith("goosedump serve:"))
        port = int(re.search(r"on http://127\.0\.0\.1:(\d+)/v1", line).group(1))
        assert port > 0
        deadline = time.monotonic() + 60       # (the line comes as the server starts, before it listens)
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["status"] == "ok"
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "the server did not answer"
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        proc.stderr.close()


def test_serve_on_a_port_in_use_says_so(tiny_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = cli("serve", tiny_path, "--port", str(port), timeout=60)
    err = fail(out, f"--port {port}")
    assert len(err.strip().splitlines()) == 1 and "serving on" not in out.stdout + err


def test_serve_takes_llama_cpps_alias_for_the_model_name(tiny_path):
    port = free_port()
    proc = subprocess.Popen([GOOSEDUMP, "serve", tiny_path, "--port", str(port), "--alias", "gpt-oss-tiny",
                             "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "the server did not answer"
                time.sleep(0.2)
        assert [m["id"] for m in r.json()["data"]] == ["gpt-oss-tiny"]
    finally:
        proc.terminate()
        proc.wait(15)


def test_plot_defaults_to_the_profiles_folder(streamed_120b, tmp_path):
    profile = tmp_path / "runs" / "p.json"
    profile.parent.mkdir()
    assert cli("run", streamed_120b, "--raw", "-p", "The quick brown fox", "-n", "6", "--expert-cache", "2M",
               "-s", "1", "--profile-out", str(profile)).returncode == 0
    out = cli("plot", str(profile))
    assert out.returncode == 0, out.stderr
    paths = out.stdout.split()
    assert paths and all(os.path.dirname(p) == str(profile.parent) and os.path.getsize(p) > 0 for p in paths)


def test_heatmap_ticks_scale_and_legend(streamed_120b, tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from goosedump import plot
    profile = tmp_path / "p.json"
    assert cli("run", streamed_120b, "--raw", "-p", "The quick brown fox", "-n", "6", "--expert-cache", "2M",
               "-s", "1", "--profile-out", str(profile)).returncode == 0
    doc = json.loads(profile.read_text())
    fig = Figure(figsize=(10, 6))
    plot._heatmap(fig, doc)
    fig.canvas.draw() if hasattr(fig.canvas, "draw") else None
    ax = fig.axes[0]
    assert ax.images[0].norm.vmin == 0
    assert all(float(t).is_integer() for t in ax.get_yticks())
    fig = Figure(figsize=(10, 6))
    plot._timeline(fig, doc)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    assert not legend.overlaps(ax.get_window_extent()), "the legend covers the bars"


def test_unused_tokens_never_reach_the_text(tiny_path, tiny_model):
    unused = [int(i) for i in tiny_model.tokenizer.unused_ids[:3]]
    assert len(tiny_model.tokenizer.unused_ids) > 0
    bias = [f"--logit-bias={i}+100" for i in unused]
    for extra in (["--temp", "0"], ["--temp", "1", "-s", "4"]):
        out = cli("run", tiny_path, "--raw", "-p", "Hi", "-n", "8", "--json", *bias, *extra)
        ids = ids_of(out)
        assert not set(ids) & set(unused)
    # a usable token with the same bias is picked every time: the bias works
    normal = 1000
    assert set(ids_of(cli("run", tiny_path, "--raw", "-p", "Hi", "-n", "4", "--json", "--temp", "0",
                          f"--logit-bias={normal}+100"))) == {normal}


def test_output_files_are_checked_before_the_run(tiny_path, tmp_path):
    """--profile-out and --routing-trace never overwrite the model (or write
    into a folder, or a folder that is not there), and say so before any
    work; the model's bytes stay as they were."""
    import shutil
    model = tmp_path / "m.gguf"
    shutil.copyfile(tiny_path, model)
    before = model.read_bytes()
    for cmd in (["run", str(model), "-p", "hi", "-n", "2", "--routing-trace", str(model)],
                ["run", str(model), "-p", "hi", "-n", "2", "--profile-out", str(model)],
                ["bench", str(model), "-p", "4", "-n", "2", "-r", "1", "--profile-out", str(model)]):
        fail(cli(*cmd), cmd[-2], "that is the model's file")
    assert model.read_bytes() == before
    fail(cli("run", str(model), "-p", "hi", "-n", "2", "--profile-out", str(tmp_path)), "--profile-out", "is a folder")
    fail(cli("run", str(model), "-p", "hi", "-n", "2", "--routing-trace", str(tmp_path / "no" / "t.json")),
         "--routing-trace", "does not exist")


def test_flag_files_and_the_prompt_cache_folder_are_checked(tiny_path):
    fail(cli("run", tiny_path, "-f", "/dev/zero", "-n", "2"), "-f/--file /dev/zero", "more than 64 MiB")
    fail(cli("run", tiny_path, "-p", "hi", "-j", "/dev/zero"), "-j/--json-schema /dev/zero", "more than 64 MiB")
    fail(cli("run", tiny_path, "-p", "hi", "-n", "2", "--prompt-cache", "/dev/null"), "--prompt-cache /dev/null",
         "not a folder")
    fail(cli("run", tiny_path, "-p", "hi", "-n", "2", env={"GOOSEDUMP_PROMPT_CACHE": "/dev/null"}),
         "$GOOSEDUMP_PROMPT_CACHE /dev/null", "not a folder")


def test_a_default_prompt_cache_that_is_no_folder_costs_the_cache_not_the_run(tiny_path, tmp_path):
    """The default folder, which the user never chose, taken by a file: the
    run goes on without the cache, saying so once (it had ended with an
    error)."""
    (tmp_path / "goosedump").mkdir()
    (tmp_path / "goosedump" / "prompt-cache").write_text("x")
    out = cli("run", tiny_path, "-p", "hi", "-n", "2", env={"XDG_CACHE_HOME": str(tmp_path), "GOOSEDUMP_PROMPT_CACHE": ""})
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("not a folder; the prompt cache is off for this run") == 1, out.stderr


@pytest.mark.parametrize("args,needles", [
    (("inspect", "{m}", "-c", "-1"), ("-c/--ctx must be at least 1", "got -1")),
    (("inspect", "{m}", "-c", "99999999"), ("-c/--ctx 99999999 is more than the model's context length",)),
    (("bench", "{m}", "-p", "1,,2", "-n", "1"), ("-p/--prompt-tokens takes integers", "'1,,2'")),
    (("bench", "{m}", "-p", "1,", "-n", "1"), ("-p/--prompt-tokens takes integers", "'1,'")),
    (("bench", "{m}", "-t", "0,-1", "-p", "1", "-n", "1"), ("-t/--threads must be at least 0, got -1",)),
    (("bench", "{m}", "-p", "99999999", "-n", "1"), ("-p 99999999 and -n 1 need a context of 100000001",)),
])
def test_inspect_and_bench_name_the_value(tiny_path, args, needles):
    fail(cli(*[a.format(m=tiny_path) for a in args]), *needles)


def test_inspect_reads_no_setting_of_the_environment(tiny_path):
    """--expert-cache wins over the variable, and inspect, which has no
    prompt cache, reads none of its settings (both had failed it)."""
    out = cli("inspect", tiny_path, "--expert-cache", "2G", env={"GOOSEDUMP_EXPERT_CACHE_SIZE": "2g"})
    assert out.returncode == 0, out.stderr
    out = cli("inspect", tiny_path, env={"GOOSEDUMP_PROMPT_CACHE_SIZE": "2g"})
    assert out.returncode == 0, out.stderr


def test_inspect_ctx_zero_is_the_models_own(tiny_path):
    import json as _json
    out = cli("inspect", tiny_path, "-c", "0", "--json")
    assert out.returncode == 0, out.stderr
    r = _json.loads(out.stdout)
    assert r["memory"]["ctx"] == r["hyperparameters"]["context_length"] > 0


def test_serve_names_a_bad_host_not_the_port(tiny_path):
    # (192.0.2.1: TEST-NET-1, documentation only, no machine's address)
    fail(cli("serve", tiny_path, "--host", "999.1.1.1", "--port", "23457", timeout=60), "--host 999.1.1.1")
    out = fail(cli("serve", tiny_path, "--host", "192.0.2.1", "--port", "23457", timeout=60),
               "--host 192.0.2.1", "not an address of this machine")
    assert "--port" not in out


def test_a_prompt_or_value_may_start_with_a_dash(tiny_path):
    """A flag's value is not a flag, whatever it starts with (a prompt that
    begins with '- '); an unknown flag is still named."""
    assert ids_of(cli("run", tiny_path, "-p", "- list three fruits", "-n", "2", "--json", "--temp", "0"))
    fail(cli("run", tiny_path, "-n", "2", "--bogus", "-p", "hi"), "unrecognized arguments: --bogus")


def test_an_empty_prompt_and_bad_stdin_are_named(tiny_path, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    for args, stdin in (((), ""), (("-p", ""), ""), (("-f", str(empty)), "")):
        fail(cli("run", tiny_path, "-n", "2", *args, stdin=stdin), "the prompt is empty")
    out = subprocess.run([GOOSEDUMP, "run", tiny_path, "-f", "-", "-n", "2"], input=b"\xff\xfe", capture_output=True,
                         timeout=120)
    assert out.returncode == 2 and b"-f -: not UTF-8 text" in out.stderr and b"Traceback" not in out.stderr


def test_synth_checks_its_flags_before_writing(tmp_path):
    fail(cli("synth", "--preset", "tiny", "--out", str(tmp_path)), "name the file to write")
    fail(cli("synth", "--preset", "tiny", "--out", str(tmp_path / "x.gguf"), "--seed", "-1"), "--seed must be 0 or more")
    assert not (tmp_path / "x.gguf").exists()


def test_cache_sim_refuses_what_no_run_could_write(tiny_path, tmp_path):
    trace = tmp_path / "t.json"
    assert cli("run", tiny_path, "-p", "hi", "-n", "3", "--expert-cache", "1M", "--routing-trace", str(trace)
               ).returncode == 0
    lines = trace.read_text().splitlines()
    meta, first = json.loads(lines[0]), json.loads(lines[1])
    first["experts"][0] = meta["n_expert"]              # one past the last expert
    bad = tmp_path / "bad.json"
    bad.write_text("\n".join([lines[0], json.dumps(first), *lines[2:]]) + "\n")
    fail(cli("cache-sim", str(bad), "--budget", "1M"), "request 1", f"outside the trace's {meta['n_layer']} layers")
    fail(cli("cache-sim", str(trace), "--slot-bytes", "-5"), "--slot-bytes must be at least 1, got -5")
    assert cli("cache-sim", str(trace), "--budget", "1M").returncode == 0


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_time_budget_must_be_some_seconds(tiny_path, value):
    fail(cli("run", tiny_path, "-p", "hi", "-n", "2", "--time-budget", value), "--time-budget must be", "above 0")


def test_a_size_flag_without_auto_does_not_offer_it(tiny_path):
    err = fail(cli("run", tiny_path, "-p", "hi", "-n", "2", "--prompt-cache-size", "lots"), "--prompt-cache-size")
    assert "expected an integer followed by M or G" in err and "expected auto" not in err


def test_run_until_the_context_is_full_counts_the_schemas_section(tiny_path):
    """run -n -1 with -j fills the room the rendered prompt leaves, the
    schema's section in the developer message counted (it had counted the
    prompt without it and overflowed the context)."""
    schema = '{"type": "object", "properties": {"a": {"type": "string"}}}'
    out = cli("run", tiny_path, "-c", "200", "-n", "-1", "-j", schema, "--temp", "0", "--json", "--no-prompt-cache",
              "hi")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["prompt_tokens"] + r["generated_tokens"] <= 200 and r["generated_tokens"] >= 1
