"""Commands copied from llama.cpp's documentation run unchanged, each through
the installed `goosedump` command: llama-server's, with its request
defaults (--temp, -n, ...) applied to requests that leave them unsaid and
-c 0 the model's own context (gguf-py's reading of the file); llama-cli's
and llama-bench's; the flags goosedump ignores named in one note, and what
it cannot do as llama.cpp means refused by name."""
import json
import subprocess
import time

import gguf
import pytest

from goosedump.sampling import SamplingParams

from test_cli_habits import GOOSEDUMP, cli, fail, free_port, ids_of
from test_server import httpx

SERVER_COMMAND = ["-c", "0", "-fa", "on", "--jinja", "-ngl", "99", "-ub", "2048", "-b", "2048", "-np", "2",
                  "--temp", "0", "-n", "6", "--top-k", "0", "--mlock", "--no-mmap", "-cb", "--metrics",
                  "--reasoning-format", "auto", "-ctk", "q8_0"]


def start(args, log, env=None):
    port = free_port()
    proc = subprocess.Popen([GOOSEDUMP, "serve", *args, "--port", str(port), "--no-prompt-cache",
                             "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(base + "/health", timeout=1).status_code in (200, 401):
                return proc, base
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the server did not answer"
        time.sleep(0.2)


def chat(base, key=None, **fields):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(base + "/v1/chat/completions", headers=headers, timeout=120,
                      json={"messages": [{"role": "user", "content": "Name a colour."}], **fields})


def test_a_copied_llama_server_command_serves_with_its_defaults(tiny_path, tmp_path):
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc, base = start(["-m", tiny_path, *SERVER_COMMAND], out)
    try:
        plain = chat(base).json()
        explicit = chat(base, temperature=0, max_tokens=6).json()
        assert plain["usage"]["completion_tokens"] == 6
        assert plain["choices"][0]["message"] == explicit["choices"][0]["message"]
        # a request's own fields win over the defaults
        assert chat(base, max_tokens=2).json()["usage"]["completion_tokens"] == 2
        hot = [chat(base, temperature=1.5, seed=s, max_tokens=6).json()["choices"][0]["message"]["content"]
               for s in (1, 2, 3)]
        assert len(set(hot)) > 1
        props = httpx.get(base + "/props", timeout=10).json()
        context = gguf.GGUFReader(tiny_path).get_field("gpt-oss.context_length").contents()
        assert props["default_generation_settings"]["n_ctx"] == context
        params = props["default_generation_settings"]["params"]
        assert (params["temperature"], params["n_predict"], params["top_k"], params["seed"]) == (0, 6, 0, -1)
        assert props["total_slots"] == 2                                   # -np 2
    finally:
        proc.terminate()
        proc.wait(30)
    said = log.read_text()
    note = next(line for line in said.splitlines() if line.startswith("goosedump: ignoring llama.cpp's"))
    for flag in ("--flash-attn on", "--jinja", "-ngl 99", "-ub 2048", "-b 2048", "--mlock", "--no-mmap", "-cb",
                 "--metrics", "-ctk q8_0"):
        assert flag in note, note
    assert "--temp" not in note and "-np" not in note and "Traceback" not in said
    assert f"context {context} tokens" in said


def test_llama_cli_flags_give_the_same_run(tiny_path):
    base = ["-p", "Tell me a story", "-n", "8", "--temp", "0", "-c", "512", "--json"]
    ours = cli("run", tiny_path, "--system", "Be brief.", *base)
    theirs = cli("run", "-m", tiny_path, "-sys", "Be brief.", "-ngl", "99", "-fa", "on", "-b", "512", "-ub", "512",
                 "--mlock", "-no-cnv", "--jinja", "-np", "4", *base)
    assert ids_of(theirs) == ids_of(ours)
    assert json.loads(theirs.stdout)["prompt_token_ids"] == json.loads(ours.stdout)["prompt_token_ids"]
    assert "ignoring llama.cpp's -ngl 99" in theirs.stderr and "-no-cnv" in theirs.stderr
    assert "-np 4: `goosedump run` and `chat` answer one conversation" in theirs.stderr
    assert "ignoring" not in ours.stderr
    # a bare -fa (old llama.cpp) does not take the prompt's first word
    bare = cli("run", tiny_path, "-fa", "Tell", "me", "a", "story", *base[2:])
    words = cli("run", tiny_path, "Tell", "me", "a", "story", *base[2:])
    assert json.loads(bare.stdout)["prompt_token_ids"] == json.loads(words.stdout)["prompt_token_ids"]


def test_c_0_is_the_models_context(tiny_path, tmp_path):
    """A prompt longer than the default context (4096) runs with -c 0, as in
    llama.cpp, and is refused without it."""
    context = int(gguf.GGUFReader(tiny_path).get_field("gpt-oss.context_length").contents())
    assert context > 6000
    prompt = tmp_path / "long.txt"
    prompt.write_text("the " * 5000)
    fail(cli("run", tiny_path, "-f", str(prompt), "-n", "1", "--raw"), "context")
    out = cli("run", tiny_path, "-c", "0", "-f", str(prompt), "-n", "1", "--raw", "--json", "--no-prompt-cache")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["prompt_tokens"] >= 5000


def test_llama_bench_flags_are_taken(tiny_path):
    out = cli("bench", tiny_path, "-ngl", "99", "-fa", "1", "-mmp", "0", "-p", "8", "-n", "2", "-r", "1", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["results"]
    assert (row["prompt_tokens"], row["gen_tokens"]) == (8, 2) and row["decode_tokens_per_s"] > 0
    assert "ignoring llama.cpp's -ngl 99, --flash-attn 1" in out.stderr and "-mmp 0" in out.stderr
    # llama-bench's -o: json as --json, md the table; the others it writes named as not taken
    doc = cli("bench", tiny_path, "-p", "8", "-n", "2", "-r", "1", "-o", "json")
    assert doc.returncode == 0 and json.loads(doc.stdout)["results"][0]["gen_tokens"] == 2, doc.stderr
    table = cli("bench", tiny_path, "-p", "8", "-n", "2", "-r", "1", "-o", "md")
    assert table.returncode == 0 and "| model" in table.stdout, table.stderr
    fail(cli("bench", tiny_path, "-o", "csv"), "-o/--output: invalid choice: 'csv'")


def test_api_key_file(tiny_path, tmp_path):
    """llama-server's key forms: --api-key-file holds a key a line (# lines
    are comments), --api-key several comma-separated; each key opens."""
    key = tmp_path / "key.txt"
    key.write_text("# the team's keys\ns3cret-key\n\nsecond-key\n")
    with open(tmp_path / "serve.log", "w") as out:
        proc, base = start([tiny_path, "--api-key-file", str(key)], out)
    try:
        assert chat(base, max_tokens=1).status_code == 401
        assert chat(base, key="s3cret-key", max_tokens=1).status_code == 200
        assert chat(base, key="second-key", max_tokens=1).status_code == 200
        assert chat(base, key="# the team's keys", max_tokens=1).status_code == 401
    finally:
        proc.terminate()
        proc.wait(30)
    with open(tmp_path / "serve2.log", "w") as out:
        proc, base = start([tiny_path, "--api-key", "k1, k2"], out)
    try:
        assert [chat(base, key=k, max_tokens=1).status_code for k in ("k1", "k2", "k1, k2", None)] == \
            [200, 200, 401, 401]
    finally:
        proc.terminate()
        proc.wait(30)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n# no key here\n")
    fail(cli("serve", tiny_path, "--api-key-file", str(empty)), "--api-key-file", "holds no key")
    fail(cli("serve", tiny_path, "--api-key", ", ,"), "--api-key", "holds no key")
    fail(cli("serve", tiny_path, "--api-key-file", str(tmp_path / "none")), "--api-key-file", "No such file")


@pytest.mark.parametrize("args,needles", [
    (["run", "-p", "x", "--reasoning-format", "none"], ["--reasoning-format none", "not supported"]),
    (["run", "-p", "x", "--chat-template", "chatml"], ["--chat-template chatml", "harmony"]),
    (["serve", "--chat-template-file", "t.jinja"], ["--chat-template t.jinja"]),
    (["serve", "--temp", "-1"], ["--temp", "temperature"]),
    (["serve", "--top-p", "1.5"], ["--top-p"]),
    (["serve", "--repeat-penalty", "inf"], ["--repetition-penalty", "finite"]),
    (["serve", "-n", "0"], ["-n/--n-predict", "got 0"]),
    (["serve", "-np", "0"], ["--max-batch (-np)", "got 0"]),
    (["serve", "--reasoning-budget", "-2"], ["--reasoning-budget", "got -2"]),
    (["serve", "--seed", "-5"], ["--seed"]),
    (["run", "-p", "x", "-hff", "a.gguf"], ["-hff/--hf-file a.gguf", "needs -hf REPO"]),
])
def test_what_cannot_be_done_as_llama_cpp_means_is_refused(tiny_path, args, needles):
    err = fail(cli(args[0], tiny_path, *args[1:]), *needles)
    assert len(err.strip().splitlines()) == 1, err


def test_serve_reasoning_budget_and_seed_defaults(tiny_path, tiny_model, tmp_path):
    with open(tmp_path / "serve.log", "w") as out:
        proc, base = start([tiny_path, "--reasoning-budget", "0", "--seed", "7", "--temp", "1"], out)
    try:
        r = chat(base, max_tokens=6).json()
        content = r["choices"][0]["message"]["content"]
        assert "reasoning_content" not in r["choices"][0]["message"]
        assert chat(base, max_tokens=6).json()["choices"][0]["message"]["content"] == content   # serve's seed
        assert chat(base, max_tokens=6, seed=7, reasoning_budget=0).json()["choices"][0]["message"]["content"] == \
            content
        second = chat(base, max_tokens=6, seed=8).json()["choices"][0]["message"]["content"]
        assert second != content
        # n choices without a seed: serve's seed plus the choice's number (they had all been serve's: n copies)
        three = [c["message"]["content"] for c in chat(base, max_tokens=6, n=3).json()["choices"]]
        assert three[:2] == [content, second] and len(set(three)) == 3
    finally:
        proc.terminate()
        proc.wait(30)
    ref = tiny_model.chat([{"role": "user", "content": "Name a colour."}], 6, reasoning_budget=0,
                          sampling=SamplingParams(temperature=1.0, seed=7))
    assert ref.reply.content == content


def test_llama_servers_environment_variables(tiny_path, tmp_path):
    """llama-server configured by its LLAMA_ARG_* variables (as its Docker
    images are) serves the same way: each gives its flag where the command
    line does not, the command line wins, flags without a value read
    on/off as llama.cpp does, the key is never printed."""
    import os
    env = {**os.environ, "LLAMA_ARG_MODEL": tiny_path, "LLAMA_ARG_CTX_SIZE": "0", "LLAMA_ARG_N_PARALLEL": "-1",
           "LLAMA_ARG_N_PREDICT": "5", "LLAMA_ARG_ALIAS": "from-env", "LLAMA_API_KEY": "k3y-from-env",
           "LLAMA_ARG_TEMPERATURE": "0", "LLAMA_ARG_N_GPU_LAYERS": "99", "LLAMA_ARG_CONT_BATCHING": "enabled",
           "LLAMA_ARG_JINJA": "off", "LLAMA_ARG_PORT": "1"}     # (start gives --port: the command line wins)
    env.pop("GOOSEDUMP_API_KEY", None)
    with open(tmp_path / "serve.log", "w") as out:
        proc, base = start(["-n7"], out, env=env)
    try:
        assert chat(base, max_tokens=1).status_code == 401
        r = chat(base, key="k3y-from-env").json()
        assert r["usage"]["completion_tokens"] == 7 and r["model"] == "from-env"     # -n7 over the variable's 5
        assert r["choices"][0]["message"] == chat(base, key="k3y-from-env", temperature=0).json()["choices"][0][
            "message"]
        props = httpx.get(base + "/props", headers={"Authorization": "Bearer k3y-from-env"}, timeout=10).json()
        context = gguf.GGUFReader(tiny_path).get_field("gpt-oss.context_length").contents()
        assert props["default_generation_settings"]["n_ctx"] == context
        assert props["total_slots"] == 4                     # -np -1: llama-server's auto, here the default
    finally:
        proc.terminate()
        proc.wait(30)
    said = (tmp_path / "serve.log").read_text()
    line = next(ln for ln in said.splitlines() if ln.startswith("goosedump: from llama.cpp's environment"))
    for part in (f"-m {tiny_path} (LLAMA_ARG_MODEL)", "-c 0 (LLAMA_ARG_CTX_SIZE)", "--api-key *** (LLAMA_API_KEY)",
                 "-ngl 99 (LLAMA_ARG_N_GPU_LAYERS)", "-cb (LLAMA_ARG_CONT_BATCHING)"):
        assert part in line, line
    assert "k3y-from-env" not in said and "LLAMA_ARG_PORT" not in line and "-n " not in line
    assert "-np -1 (LLAMA_ARG_N_PARALLEL)" in line
    assert "JINJA" not in line and "--jinja" not in said
    note = next(ln for ln in said.splitlines() if ln.startswith("goosedump: ignoring llama.cpp's"))
    assert "-ngl 99" in note and "-cb" in note
    # a value its flag cannot take names the variable; a model given as a word wins over LLAMA_ARG_MODEL
    fail(cli("serve", tiny_path, env={"LLAMA_ARG_PORT": "eighty"}), "LLAMA_ARG_PORT=eighty", "--port takes an int")
    fail(cli("serve", tiny_path, env={"LLAMA_ARG_MODEL": "/nowhere.gguf", "LLAMA_ARG_CTX_SIZE": "-5"}), "-c", "-5")


def test_what_the_command_line_gives_wins_over_the_environment(monkeypatch):
    """However a flag is spelled (abbreviated, its value attached, the
    default's own value) and in whichever form of its group (a model as a
    word, -m or -hf; --api-key, --api-key-file or $GOOSEDUMP_API_KEY), the
    command line's wins; a word llama.cpp does not read as on leaves a flag
    without a value off."""
    from goosedump import cli as cli_module, llamacpp_flags
    parser, subs = cli_module.build_parser()
    env = {"LLAMA_ARG_PORT": "9000", "LLAMA_ARG_CTX_SIZE": "64", "LLAMA_ARG_HF_FILE": "f.gguf",
           "LLAMA_ARG_API_KEY_FILE": "/keys", "LLAMA_API_KEY": "k", "LLAMA_ARG_JINJA": "maybe",
           "LLAMA_ARG_N_GPU_LAYERS": "99", "LLAMA_ARG_HOST": "0.0.0.0"}
    for name in list(cli_module.os.environ):
        if name.startswith("LLAMA_") or name == cli_module.ENV_API_KEY:
            monkeypatch.delenv(name)
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def applied(*words):
        argv = ["serve", *words]
        args = cli_module._serve_environment(parser, subs["serve"], argv, parser.parse_args(argv))
        return {k: getattr(args, k) for k in ("port", "ctx", "hf_file", "api_key", "api_key_file", "host")}

    assert applied("m.gguf") == {"port": 9000, "ctx": 64, "hf_file": None, "api_key": "k",
                                 "api_key_file": "/keys", "host": "0.0.0.0"}    # (a word's model: no -hff)
    got = applied("--model", "m.gguf", "--po", "8080", "-c8192", "--host", "127.0.0.1", "--api-key", "mine")
    assert got == {"port": 8080, "ctx": 8192, "hf_file": None, "api_key": "mine", "api_key_file": None,
                   "host": "127.0.0.1"}
    assert applied("-m", "m.gguf", "--api-key-file", "/mine")["api_key"] is None
    monkeypatch.setenv(cli_module.ENV_API_KEY, "ours")
    parser, subs = cli_module.build_parser()          # (--api-key's default is read as the parser is built)
    got = applied("m.gguf")
    assert (got["api_key"], got["api_key_file"]) == ("ours", None)
    words, said = llamacpp_flags.from_environment(subs["serve"], {"LLAMA_ARG_JINJA": "maybe",
                                                                  "LLAMA_ARG_CONT_BATCHING": "on"}, set())
    assert words == ["-cb"] and said.endswith("-cb (LLAMA_ARG_CONT_BATCHING)")


def test_p_reads_escapes_as_llama_cpp_does(tiny_path):
    """llama.cpp reads -p's \\n, \\t, \\", \\\\, \\xHH ... (its default --escape):
    a prompt typed for it means the same here; --no-escape takes it as typed,
    and the words after the model (ollama's) are never read so."""
    from goosedump.arguments import process_escapes

    def prompt_ids(*args):
        out = cli("run", tiny_path, "--raw", "-n", "1", "--json", "--temp", "0", *args)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["prompt_token_ids"]
    typed = prompt_ids("-p", "a\nb\t\"c\" \\ d \u00e9")
    assert prompt_ids("-p", r"a\nb\t\"c\" \\ d \xc3\xa9") == typed
    assert prompt_ids("-e", "-p", r"a\nb\t\"c\" \\ d \xC3\xA9") == typed
    assert prompt_ids("--no-escape", "-p", r"a\nb") == prompt_ids("-p", r"a\\nb") != prompt_ids("-p", r"a\nb")
    assert prompt_ids(r"a\nb") == prompt_ids("--no-escape", "-p", r"a\nb")
    fail(cli("run", tiny_path, "-p", r"caf\xc3", "-n", "1"), "-p: its \\x escapes make no UTF-8 text")
    # as string_process_escapes: an unknown escape, a short \x and a last lone backslash stay as typed
    assert process_escapes(r"\q \x4 \xzz end\\") == r"\q \x4 \xzz end" + "\\"
    assert process_escapes("\\") == "\\" and process_escapes(r"\x41") == "A" and process_escapes(r"\'") == "'"


@pytest.mark.parametrize("flag", ["-mli", "-sp", "-co", "-nr", "-tps"])
def test_llama_cpp_longer_short_flags_are_named_not_split(tiny_path, flag):
    """llama.cpp's -mli, -sp, -tps, ...: argparse had read them as -m li
    (another model, silently), -s p, -t ps."""
    out = fail(cli("run", "-m", tiny_path, "-p", "hi", "-n", "1", flag, "x"), f"unrecognized arguments: {flag}")
    assert "usage:" in out


def test_a_short_flag_and_its_number_may_be_joined(tiny_path):
    joined = cli("run", tiny_path, "-p", "hi", "-n2", "-s1", "-t1", "--json")
    assert ids_of(joined) == ids_of(cli("run", tiny_path, "-p", "hi", "-n", "2", "-s", "1", "-t", "1", "--json"))
