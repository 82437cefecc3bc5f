"""Models by name against a local stand-in for the Hugging Face Hub (the real
huggingface_hub client, HF_ENDPOINT on 127.0.0.1): REPO, REPO:QUANT and
REPO:FILE, split sets downloaded whole, pull, list, the cache found again
offline, and clear errors (never a traceback) when a name matches nothing."""
import json
import os
import subprocess
import sys

import pytest

from goosedump import synth
from hub_stub import Hub

REPO = "someorg/gpt-oss-tiny-GGUF"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, small_vocab):
    d = tmp_path_factory.mktemp("hubfiles")
    files = {}

    def add(path_in_repo, recipe, split=None):
        out = d / os.path.basename(path_in_repo)
        synth.write_model(out, "tiny", seed=5, vocab=small_vocab, recipe=recipe, split_max_size=split)
        if split:
            for p in sorted(d.glob(out.name.removesuffix(".gguf") + "-*-of-*.gguf")):
                files[os.path.dirname(path_in_repo) + "/" + p.name if "/" in path_in_repo else p.name] = p.read_bytes()
        else:
            files[path_in_repo] = out.read_bytes()

    add("gpt-oss-tiny-mxfp4.gguf", "mxfp4")
    add("gpt-oss-tiny-Q4_K_M.gguf", "q4_k_m")
    add("Q8_0/gpt-oss-tiny-Q8_0.gguf", "q8_0", split=60_000)     # a split set in a folder, as unsloth ships
    files["README.md"] = b"tiny\n"
    with Hub({REPO: files, "someorg/only-one-GGUF": {"model-F16.gguf": files["gpt-oss-tiny-mxfp4.gguf"]}}) as h:
        h.files = files
        yield h


def run(hub, cache, *args, offline=False):
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    out = subprocess.run([sys.executable, "-m", "goosedump", *args], capture_output=True, text=True, env=env)
    assert "Traceback" not in out.stderr, out.stderr
    return out


def test_hf_token_is_llama_cpps_hft(hub, tmp_path):
    """llama.cpp's -hft TOKEN reaches the Hub as the bearer token (it had
    been read as -h -f t: the help, exit 0)."""
    env_token = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    before = len(hub.tokens)
    out = subprocess.run([sys.executable, "-m", "goosedump", "pull", f"{REPO}:Q4_K_M", "-hft", "hf_secret123"],
                         capture_output=True, text=True, env={**env_token, "HF_ENDPOINT": hub.endpoint,
                                                              "HF_HUB_CACHE": str(tmp_path),
                                                              "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    assert out.returncode == 0, out.stderr
    sent = [t for line, t in zip(hub.log[before:], hub.tokens[before:]) if REPO in line]     # (the repo's routes)
    assert sent and set(sent) == {"hf_secret123"}


def test_a_quant_tag_downloads_the_whole_split_set(hub, tmp_path):
    parts = sorted(f for f in hub.files if f.startswith("Q8_0/"))
    assert len(parts) >= 3
    out = run(hub, tmp_path, "pull", f"{REPO}:q8_0")          # case-insensitive, as llama.cpp
    assert out.returncode == 0, out.stderr
    paths = out.stdout.split()
    assert [p.split("/snapshots/")[1].split("/", 1)[1] for p in paths] == parts
    for p, name in zip(paths, parts):
        with open(p, "rb") as f:
            assert f.read() == hub.files[name]
    # then it runs from the cache, even offline
    r = run(hub, tmp_path, "run", f"{REPO}:Q8_0", "-p", "hi", "-n", "3", "--json", "--temperature", "0", offline=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["generated_tokens"] == 3


def test_a_repo_alone_takes_its_mxfp4_file(hub, tmp_path):
    out = run(hub, tmp_path, "run", REPO, "-p", "hi", "-n", "2", "--json")
    assert out.returncode == 0, out.stderr
    assert any(line.endswith(f"/resolve/main/gpt-oss-tiny-mxfp4.gguf") for line in hub.log)
    one = run(hub, tmp_path, "inspect", "someorg/only-one-GGUF", "--json")   # else the only model
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["files"][0]["path"].endswith("model-F16.gguf")


def test_a_file_name_and_a_later_part(hub, tmp_path):
    out = run(hub, tmp_path, "pull", f"{REPO}:gpt-oss-tiny-Q4_K_M.gguf")
    assert out.returncode == 0 and out.stdout.strip().endswith("gpt-oss-tiny-Q4_K_M.gguf"), out.stderr
    second = sorted(f for f in hub.files if f.startswith("Q8_0/"))[1]
    out = run(hub, tmp_path, "pull", f"{REPO}:{second}")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) >= 3


def test_llama_cpps_hf_flags_name_the_same_files(hub, tmp_path):
    """-hf REPO[:QUANT] and -hf REPO -hff FILE, as llama.cpp spells them."""
    out = run(hub, tmp_path, "pull", "-hf", REPO, "-hff", "gpt-oss-tiny-Q4_K_M.gguf")
    assert out.returncode == 0 and out.stdout.strip().endswith("gpt-oss-tiny-Q4_K_M.gguf"), out.stderr
    ref = run(hub, tmp_path, "run", "-hf", f"{REPO}:Q4_K_M", "-p", "hi", "-n", "2", "--json", "--temperature", "0",
              offline=True)
    assert ref.returncode == 0, ref.stderr
    same = run(hub, tmp_path, "run", "-hf", REPO, "-hff", "gpt-oss-tiny-Q4_K_M.gguf", "-p", "hi", "-n", "2",
               "--json", "--temperature", "0", offline=True)
    assert json.loads(same.stdout)["token_ids"] == json.loads(ref.stdout)["token_ids"]


def test_list_shows_the_cached_models(hub, tmp_path):
    assert run(hub, tmp_path, "pull", f"{REPO}:Q8_0").returncode == 0
    assert run(hub, tmp_path, "pull", f"{REPO}:MXFP4").returncode == 0
    out = run(hub, tmp_path, "list", "--json")
    models = {m["name"]: m for m in json.loads(out.stdout)["models"]}
    assert set(models) == {f"{REPO}:Q8_0", f"{REPO}:MXFP4"}
    q8 = models[f"{REPO}:Q8_0"]
    assert q8["parts"] >= 3 and q8["complete"]
    assert q8["bytes"] == sum(len(b) for f, b in hub.files.items() if f.startswith("Q8_0/"))
    text = run(hub, tmp_path, "list")
    assert f"{REPO}:Q8_0" in text.stdout and "KiB" in text.stdout and "00001-of-" in text.stdout


@pytest.mark.parametrize("name,message", [
    (f"{REPO}:Q9_9", "no file of someorg/gpt-oss-tiny-GGUF carries the quant tag 'Q9_9'; its models: "),
    (f"{REPO}:nope.gguf", "someorg/gpt-oss-tiny-GGUF has no file nope.gguf; its models: "),
    ("someorg/missing-GGUF", "someorg/missing-GGUF: no such repo on the Hugging Face Hub"),
    ("models/x.gguf", "models/x.gguf: no such file"),
])
def test_names_that_match_nothing(hub, tmp_path, name, message):
    out = run(hub, tmp_path, "run", name, "-p", "hi")
    assert out.returncode == 2 and message in out.stderr, out.stderr
    if "its models" in message:    # the choices, with sizes and parts
        assert "gpt-oss-tiny-Q4_K_M.gguf (" in out.stderr and "parts)" in out.stderr


def test_offline_names_say_what_to_download(hub, tmp_path):
    out = run(hub, tmp_path, "run", f"{REPO}:Q4_K_M", "-p", "hi", offline=True)
    assert out.returncode == 2
    assert "the Hugging Face Hub cannot be reached (HF_HUB_OFFLINE is set)" in out.stderr
    assert f"hf download {REPO} --include '*Q4_K_M*'" in out.stderr and str(tmp_path) in out.stderr
    out = run(hub, tmp_path, "pull", "ggml-org/gpt-oss-120b-GGUF", offline=True)
    assert out.returncode == 2 and "gpt-oss-120b-mxfp4-00003-of-00003.gguf" in out.stderr


def test_a_partly_downloaded_split_set_is_fetched_whole_and_listed_as_incomplete(hub, tmp_path):
    """A set with a part missing from the cache had counted as complete:
    `pull` never fetched the rest, `list` never said so."""
    assert run(hub, tmp_path, "pull", f"{REPO}:Q8_0").returncode == 0
    snap = next(tmp_path.glob("models--*/snapshots/*"))
    last = sorted(snap.glob("Q8_0/*.gguf"))[-1]
    last.unlink()
    out = run(hub, tmp_path, "list", "--json")
    (q8,) = [m for m in json.loads(out.stdout)["models"] if m["name"] == f"{REPO}:Q8_0"]
    assert not q8["complete"]
    assert "(incomplete: `goosedump pull` fetches the rest)" in run(hub, tmp_path, "list").stdout
    offline = run(hub, tmp_path, "pull", f"{REPO}:Q8_0", offline=True)
    assert offline.returncode == 2 and "cannot be reached" in offline.stderr
    out = run(hub, tmp_path, "pull", f"{REPO}:Q8_0")
    assert out.returncode == 0, out.stderr
    assert last.exists() and any(line.endswith(last.name) for line in hub.log)
    # part 1 gone, the others there: listed, as incomplete
    first = sorted(snap.glob("Q8_0/*.gguf"))[0]
    first.unlink()
    (q8,) = [m for m in json.loads(run(hub, tmp_path, "list", "--json").stdout)["models"]
             if m["name"] == f"{REPO}:Q8_0"]
    assert not q8["complete"] and q8["path"] is None


def test_a_tag_is_a_whole_word_of_the_file_name(tmp_path):
    """:F16 had picked the BF16 file (an unanchored search); every name
    `list` prints resolves to that row's file."""
    from goosedump.hub import Name, choose, quant_tag
    files = ["gpt-oss-20b-BF16.gguf", "gpt-oss-20b-F16.gguf", "gpt-oss-20b-Q4_K_M.gguf", "gpt-oss-20b.gguf"]
    for f in files:
        assert choose(Name("o/r", tag=quant_tag(f)), files) == [f]
    assert choose(Name("o/r", tag="f16"), files) == ["gpt-oss-20b-F16.gguf"]
    assert choose(Name("o/r", tag="q4_k_m"), files) == ["gpt-oss-20b-Q4_K_M.gguf"]


def test_ollama_names_folders_and_two_models(hub, tmp_path, monkeypatch):
    # hf.co/ORG/REPO:QUANT (ollama's spelling of a Hub model) is the repo
    out = run(hub, tmp_path, "pull", f"hf.co/{REPO}:Q4_K_M")
    assert out.returncode == 0 and out.stdout.strip().endswith("gpt-oss-tiny-Q4_K_M.gguf"), out.stderr
    out = run(hub, tmp_path, "pull", f"https://huggingface.co/{REPO}:Q4_K_M", offline=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("gpt-oss-tiny-Q4_K_M.gguf"), out.stderr
    # ollama's gpt-oss:20b is ggml-org's MXFP4 repo (offline here: its file is named)
    out = run(hub, tmp_path, "pull", "gpt-oss:20b", offline=True)
    assert out.returncode == 2 and "ggml-org/gpt-oss-20b-GGUF/gpt-oss-20b-mxfp4.gguf" in out.stderr
    # a folder named like the repo, holding no model, does not hide the repo; one holding models is read
    work = tmp_path / "work"
    (work / REPO).mkdir(parents=True)
    env_run = lambda *a: subprocess.run([sys.executable, "-m", "goosedump", *a], capture_output=True, text=True,
                                        cwd=work, env={**os.environ, "HF_ENDPOINT": hub.endpoint,
                                                       "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    out = env_run("pull", f"{REPO}:Q4_K_M")
    assert out.returncode == 0 and out.stdout.strip().endswith("gpt-oss-tiny-Q4_K_M.gguf"), out.stderr
    (work / REPO / "gpt-oss-tiny-MXFP4.gguf").write_bytes(hub.files["gpt-oss-tiny-mxfp4.gguf"])
    out = env_run("pull", REPO)
    assert out.returncode == 0 and out.stdout.strip() == f"{REPO}/gpt-oss-tiny-MXFP4.gguf", out.stderr
    # FOLDER:QUANT, as REPO:QUANT
    (work / REPO / "gpt-oss-tiny-Q4_K_M.gguf").write_bytes(hub.files["gpt-oss-tiny-Q4_K_M.gguf"])
    out = env_run("pull", f"{REPO}:q4_k_m")
    assert out.returncode == 0 and out.stdout.strip() == f"{REPO}/gpt-oss-tiny-Q4_K_M.gguf", out.stderr
    # a folder named as ollama's model (a clone of openai/gpt-oss), holding no GGUF, does not hide the name
    (work / "gpt-oss").mkdir()
    out = env_run("pull", "gpt-oss")
    assert out.returncode == 2 and "ggml-org/gpt-oss-20b-GGUF" in out.stderr and "holding no GGUF" not in out.stderr
    # two models named: an error, not one dropped
    out = env_run("pull", f"{REPO}/gpt-oss-tiny-MXFP4.gguf", "-m", f"{REPO}:Q4_K_M")
    assert out.returncode == 2 and "two models named" in out.stderr
    # a bad $GOOSEDUMP_MODEL says where the name came from; HF_HUB_OFFLINE=false is online, as in huggingface_hub
    out = subprocess.run([sys.executable, "-m", "goosedump", "pull"], capture_output=True, text=True,
                         env={**os.environ, "GOOSEDUMP_MODEL": "/nope.gguf"})
    assert out.returncode == 2 and "$GOOSEDUMP_MODEL: /nope.gguf: no such file" in out.stderr
    out = subprocess.run([sys.executable, "-m", "goosedump", "pull", f"{REPO}:Q4_K_M"], capture_output=True,
                         text=True, env={**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(tmp_path / "c2"),
                                         "HF_HUB_OFFLINE": "false"})
    assert out.returncode == 0, out.stderr


def test_pull_names_the_default_and_several_cached_models_offline(hub, tmp_path):
    assert run(hub, tmp_path, "pull", f"{REPO}:Q4_K_M").returncode == 0
    assert run(hub, tmp_path, "pull", f"{REPO}:MXFP4").returncode == 0
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(tmp_path), "GOOSEDUMP_MODEL": REPO}
    out = subprocess.run([sys.executable, "-m", "goosedump", "pull"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stderr.startswith(f"{REPO}: 1 file"), out.stderr
    # the cache holds two models of a repo without MXFP4 in their names: offline, they are the choices
    snap = next(tmp_path.glob("models--*/snapshots/*"))
    (snap / "gpt-oss-tiny-mxfp4.gguf").rename(snap / "gpt-oss-tiny-F16.gguf")
    out = run(hub, tmp_path, "pull", REPO, offline=True)
    assert out.returncode == 2 and "holds 2 models; name one" in out.stderr and "in the Hugging Face cache" in out.stderr
    # a cache that holds no model of the repo (its README): offline, what to download
    readme = tmp_path / "readme-only" / "models--someorg--only-one-GGUF"
    (readme / "refs").mkdir(parents=True)
    (readme / "refs" / "main").write_text("abc")
    (readme / "snapshots" / "abc").mkdir(parents=True)
    (readme / "snapshots" / "abc" / "README.md").write_text("hi")
    out = run(hub, tmp_path / "readme-only", "pull", "someorg/only-one-GGUF", offline=True)
    assert out.returncode == 2 and "hf download someorg/only-one-GGUF" in out.stderr
    # TRANSFORMERS_OFFLINE counts only where HF_HUB_OFFLINE is unset, as in huggingface_hub
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(tmp_path / "c3"), "HF_HUB_OFFLINE": "0",
           "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "goosedump", "pull", f"{REPO}:Q4_K_M"], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0, out.stderr


def test_a_hub_that_never_answers_is_given_up_on(tmp_path, monkeypatch):
    """A host that takes the connection and never answers (a stalled proxy)
    had hung `pull` for good: the listing has a bound."""
    import socket
    from goosedump import hub as hubmod
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        monkeypatch.setattr(hubmod, "LISTING_TIMEOUT", 2.0)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        import huggingface_hub
        with pytest.raises(hubmod.ModelNotFoundError, match="did not answer in 2 s"):
            hubmod._listing(huggingface_hub.HfApi(endpoint=os.environ["HF_ENDPOINT"]), "someorg/stalled-GGUF")
    finally:
        server.close()


def test_a_repo_alone_is_its_mxfp4_file_whatever_else_was_pulled_first(hub, tmp_path):
    """The only model cached stands for a bare REPO only offline: online the
    Hub's listing decides (a Q4_K_M pulled first had been the repo's model
    from then on, without asking)."""
    assert run(hub, tmp_path, "pull", f"{REPO}:Q4_K_M").returncode == 0
    out = run(hub, tmp_path, "pull", REPO)
    assert out.returncode == 0 and out.stdout.strip().endswith("gpt-oss-tiny-mxfp4.gguf"), (out.stdout, out.stderr)
    cache = tmp_path / "c2"
    assert run(hub, cache, "pull", f"{REPO}:Q4_K_M").returncode == 0
    out = run(hub, cache, "pull", REPO, offline=True)          # offline: the model there is
    assert out.returncode == 0 and out.stdout.strip().endswith("gpt-oss-tiny-Q4_K_M.gguf"), out.stderr


def test_two_models_of_one_quant_are_named_by_their_files(tmp_path):
    """A repo with a 20b and a 120b Q4_K_M: REPO:Q4_K_M had taken the first
    silently, and `list` had named both REPO:Q4_K_M."""
    from goosedump.hub import AmbiguousModelError, Name, choose
    files = ["gpt-oss-120b-Q4_K_M.gguf", "gpt-oss-20b-Q4_K_M.gguf", "gpt-oss-20b-Q8_0.gguf"]
    with pytest.raises(AmbiguousModelError, match="2 models of o/r carry the quant tag 'Q4_K_M'; name one as o/r:FILE"):
        choose(Name("o/r", tag="Q4_K_M"), files)
    assert choose(Name("o/r", tag="Q8_0"), files) == ["gpt-oss-20b-Q8_0.gguf"]
    assert choose(Name("o/r", file="gpt-oss-20b-Q4_K_M.gguf"), files) == ["gpt-oss-20b-Q4_K_M.gguf"]


def test_folders_and_files_that_are_not_models(hub, tmp_path):
    """A folder's own models before its subfolders', subfolders two deep at
    most (`inspect /` had walked the disk, and picked a file anywhere below
    with mxfp4 in its name); a folder with a colon in its name; a pipe and a
    dangling link named for what they are (not "no such file"; a pipe's
    open had waited for a writer)."""
    top = tmp_path / "models:v1"
    (top / "deep" / "deeper" / "deepest").mkdir(parents=True)
    (top / "gpt-oss-tiny-Q4_K_M.gguf").write_bytes(hub.files["gpt-oss-tiny-Q4_K_M.gguf"])
    (top / "deep" / "other-mxfp4.gguf").write_bytes(hub.files["gpt-oss-tiny-mxfp4.gguf"])
    out = run(hub, tmp_path, "pull", str(top), offline=True)
    assert out.returncode == 0 and out.stdout.strip() == f"{top}/gpt-oss-tiny-Q4_K_M.gguf", (out.stdout, out.stderr)
    assert run(hub, tmp_path, "pull", f"{top}/", offline=True).returncode == 0
    (top / "gpt-oss-tiny-Q4_K_M.gguf").unlink()
    (top / "deep" / "other-mxfp4.gguf").rename(top / "deep" / "deeper" / "deepest" / "x-mxfp4.gguf")
    out = run(hub, tmp_path, "pull", str(top), offline=True)
    assert out.returncode == 2 and "holding no GGUF model" in out.stderr, out.stderr
    fifo, link = tmp_path / "pipe.gguf", tmp_path / "gone.gguf"
    os.mkfifo(fifo)
    os.symlink(tmp_path / "nowhere.gguf", link)
    out = run(hub, tmp_path, "inspect", str(fifo), offline=True)
    assert out.returncode == 2 and "not a regular file (a pipe, device or socket)" in out.stderr, out.stderr
    out = run(hub, tmp_path, "inspect", str(link), offline=True)
    assert out.returncode == 2 and "a symbolic link to a file that does not exist" in out.stderr, out.stderr


def test_a_repo_the_hub_no_longer_lists_is_still_its_cached_model(hub, tmp_path):
    """The Hub reachable, the repo gone from it (deleted, private, a lapsed
    token, a 5xx): a bare REPO whose only cached model is not its MXFP4
    file is that model, with a note, not an error."""
    hub.repos["someorg/fading-GGUF"] = {"model-Q4_K_M.gguf": hub.files["gpt-oss-tiny-Q4_K_M.gguf"]}
    try:
        assert run(hub, tmp_path, "pull", "someorg/fading-GGUF").returncode == 0
    finally:
        del hub.repos["someorg/fading-GGUF"]
    out = run(hub, tmp_path, "pull", "someorg/fading-GGUF")
    assert out.returncode == 0 and out.stdout.strip().endswith("model-Q4_K_M.gguf"), out.stderr
    assert "note: " in out.stderr and "using the model in the Hugging Face cache, model-Q4_K_M.gguf" in out.stderr
