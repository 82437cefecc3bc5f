"""Generation: stop conditions, streaming, the result, the CLI and model names."""
import json
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import goosedump
from goosedump import synth
from goosedump.generate import ContextOverflowError, repetition_loop
from goosedump.hub import ModelNotFoundError, resolve_model

PROMPT = "The quick brown fox"


def test_max_tokens_and_result_fields(tiny_model):
    r = tiny_model.generate(PROMPT, max_tokens=12)
    assert r.stop_reason == "max_tokens" and r.generated_tokens == 12
    assert r.prompt_token_ids == tiny_model.tokenizer.encode(PROMPT)
    assert r.text == tiny_model.tokenizer.decode(r.token_ids)
    assert r.prefill_seconds > 0 and r.decode_seconds > 0 and r.decode_steps == 11
    d = r.to_dict()
    for key in ("prompt_token_ids", "token_ids", "text", "stop_reason", "prompt_tokens", "generated_tokens",
                "prefill_seconds", "decode_seconds"):
        assert key in d


def test_greedy_is_deterministic_and_text_or_ids_agree(tiny_model):
    a = tiny_model.generate(PROMPT, max_tokens=10)
    b = tiny_model.generate(tiny_model.tokenizer.encode(PROMPT), max_tokens=10)
    assert a.token_ids == b.token_ids


def test_stops_on_end_of_generation(tiny_model, monkeypatch):
    first = tiny_model.generate(PROMPT, max_tokens=6).token_ids
    # Declare the 4th generated token an end-of-generation token.
    monkeypatch.setattr(tiny_model.tokenizer, "eog_ids", frozenset({first[3]}))
    r = tiny_model.generate(PROMPT, max_tokens=6)
    assert r.stop_reason == "eos" and r.eos_token_id == first[3] and r.token_ids == first[:3]


def test_time_budget(tiny_model):
    r = tiny_model.generate(PROMPT, max_tokens=50, time_budget=0.0)
    assert r.stop_reason == "time_budget" and r.generated_tokens == 1


@pytest.mark.parametrize("seq,loop", [
    ([7] * 16, True), ([7] * 15, False),
    ([1, 2] * 8, True), ([1, 2] * 7 + [1], False),
    ([5, 6, 7, 8, 9] * 4, True), ([5, 6, 7, 8, 9] * 3 + [5, 6, 7, 8], False),
    (list(range(32)) * 4, True), (list(range(33)) * 4, False),
    ([9, 9] + list(range(20)) + [3, 4, 5] * 6, True), (list(range(100)), False),
])
def test_repetition_loop(seq, loop):
    assert repetition_loop(seq) is loop


def test_context_overflow_is_an_error_before_any_work(tiny_path):
    model = goosedump.load(tiny_path, n_ctx=16)
    with pytest.raises(ContextOverflowError, match=r"the prompt \(4 tokens\) plus max_tokens \(13\) exceeds "
                                                   r"the context of 16 tokens"):
        model.generate(PROMPT, max_tokens=13)
    assert model._cache is None  # nothing was allocated or run
    assert model.generate(PROMPT, max_tokens=12).generated_tokens == 12


def test_bad_inputs(tiny_model):
    with pytest.raises(ValueError, match="token id 201088 is outside the vocabulary"):
        tiny_model.generate([1, 201088])
    with pytest.raises(ValueError, match="the prompt is empty"):
        tiny_model.generate("")
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        tiny_model.generate(PROMPT, max_tokens=0)


@pytest.mark.parametrize("prompt, message", [
    (np.array([976.7, 4853.2]), "one-dimensional, of integers; got a 1-D array of float64"),   # (had been truncated)
    (np.zeros((2, 2), np.int64), "got a 2-D array"),
    (["976", "4853"], "token ids are integers, got '976'"),
    ([True, False], "token ids are integers, got True"),
    (b"Hello", "text (a str) or a sequence of token ids, got bytes"),          # (had been its byte values)
    (None, "got NoneType"),
    (976, "got int"),
])
def test_a_prompt_that_is_neither_text_nor_token_ids_is_named(tiny_model, prompt, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tiny_model.generate(prompt, max_tokens=2)


@pytest.mark.parametrize("kw, message", [
    ({"max_tokens": None}, "max_tokens must be a whole number of tokens, at least 1, got None"),
    ({"max_tokens": 2.5}, "max_tokens must be a whole number of tokens, at least 1, got 2.5"),
    ({"time_budget": "1"}, "time_budget must be a number of seconds >= 0"),
    ({"time_budget": float("nan")}, "time_budget must be a number of seconds >= 0"),
    ({"prompt_logprobs": -1}, "prompt_logprobs must be a number of alternatives"),
    ({"sampling": {"temperature": 0.5}}, "sampling must be a goosedump.sampling.SamplingParams, got dict"),
])
def test_generation_arguments_are_checked_before_any_work(tiny_model, kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tiny_model.generate([976, 4853], **{"max_tokens": 2, **kw})


def test_a_stream_read_twice_or_waited_on_again_returns(tiny_model):
    """A generation whose events were all taken gives none again (wait(),
    a second loop over it and a chat turn iterated again had waited for
    ever)."""
    g = tiny_model.generate_stream([976, 4853], 5)
    text = "".join(g)
    assert g.wait().text == text and list(g) == [] and list(g.events()) == []
    turn = tiny_model.chat([{"role": "user", "content": "hi"}], 5)
    assert list(turn) == []


def test_two_generations_of_one_model_do_not_share_its_cache_silently(tiny_model):
    """One model's KV cache serves one generation at a time: a stream set
    aside while another runs, or two threads, had both given wrong tokens.
    Whichever steps takes the cache; the other ends, cancelled."""
    a, b = [976, 4853, 19705], [5, 77, 300]
    ref_a, ref_b = tiny_model.generate(a, 10).token_ids, tiny_model.generate(b, 10).token_ids
    ga, gb = tiny_model.generate_stream(a, 10), tiny_model.generate_stream(b, 10)
    ea, eb = ga.events(), gb.events()
    taken_a = [next(ea)[0]]
    taken_b = [t for t, _ in eb if t is not None]
    taken_a += [t for t, _ in ea if t is not None]
    assert taken_b == ref_b and gb.result.stop_reason == "max_tokens"
    assert ga.result.stop_reason == "cancelled" and taken_a == ref_a[:len(taken_a)]
    # two generations created, then run one after the other: each whole
    g1, g2 = tiny_model.generate_stream(a, 10), tiny_model.generate_stream(b, 10)
    assert g1.wait().token_ids == ref_a and g2.wait().token_ids == ref_b
    # from two threads: each one's tokens are its own, or it says it was cancelled
    out = {}
    threads = [threading.Thread(target=lambda k, p: out.__setitem__(k, tiny_model.generate(p, 30)), args=(k, p))
               for k, p in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, p in (("a", a), ("b", b)):
        r, ref = out[k], tiny_model.generate(p, 30).token_ids
        assert r.token_ids == ref[:len(r.token_ids)] and (r.stop_reason == "cancelled" or r.token_ids == ref), k


def test_load_arguments_are_checked(tiny_path):
    from goosedump.options import Options
    for kw, message in [({"n_ctx": 100.5}, "n_ctx must be a whole number of tokens"),
                        ({"threads": 2 ** 31}, "threads must be a number of threads from 0"),
                        ({"expert_cache": 1.5}, "expert_cache must be a number of bytes"),
                        ({"page_cache": "no"}, "page_cache must be True or False"),
                        ({"threads": 2, "options": Options()}, "give options, or threads")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            goosedump.load(tiny_path, **kw)
    m = goosedump.load(tiny_path)
    m.close()
    with pytest.raises(RuntimeError, match="the model is closed"):
        m.generate([976], 2)


def test_streaming_yields_whole_text(tiny_model):
    gen = tiny_model.generate_stream(PROMPT, max_tokens=30)
    pieces = list(gen)
    assert "".join(pieces) == gen.result.text
    assert all("\ufffd" not in p for p in pieces) or "\ufffd" in gen.result.text
    seen = []
    r = tiny_model.generate(PROMPT, max_tokens=30, on_text=seen.append)
    assert seen == pieces and r.token_ids == gen.result.token_ids


def run_cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "goosedump", *args], capture_output=True, text=True, **kw)


def test_cli_run_streams_text(tiny_path, tiny_model):
    out = run_cli("run", tiny_path, "-p", PROMPT, "--raw", "--temperature", "0", "--max-tokens", "8", "--threads", "1")
    assert out.returncode == 0, out.stderr
    expect = tiny_model.generate(PROMPT, max_tokens=8)
    assert out.stdout.rstrip("\n") == expect.text
    assert "stop: max_tokens" in out.stderr


def test_cli_run_json_and_prompt_sources(tiny_path, tiny_model, tmp_path):
    ids = tiny_model.tokenizer.encode(PROMPT)
    out = run_cli("run", tiny_path, "--prompt-ids", ",".join(map(str, ids)), "-n", "5", "--json", "--ctx", "64",
                  "--temperature", "0")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["prompt_token_ids"] == ids and r["generated_tokens"] == 5 == len(r["token_ids"])
    assert r["stop_reason"] == "max_tokens" and r["prompt_tokens"] == len(ids)
    assert r["prefill_seconds"] > 0 and r["decode_seconds"] > 0
    f = tmp_path / "prompt.txt"
    f.write_text(PROMPT, encoding="utf-8")
    out2 = run_cli("run", tiny_path, "--prompt-file", str(f), "--raw", "-n", "5", "--json", "--temperature", "0")
    assert json.loads(out2.stdout)["token_ids"] == r["token_ids"]


@pytest.mark.parametrize("args,message", [
    (["-p", "x", "--prompt-ids", "1"], "give one prompt"),
    (["--prompt-ids", "1,a"], "--prompt-ids must be comma-separated integers"),
    (["-p", "x", "--ctx", "8", "-n", "8"], "exceeds the context of 8 tokens"),
    (["--prompt-ids", "300000"], "token id 300000 is outside the vocabulary"),
])
def test_cli_run_errors(tiny_path, args, message):
    out = run_cli("run", tiny_path, *args)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_model_names_offline_fail_at_once(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    t0 = time.perf_counter()
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("ggml-org/gpt-oss-20b-GGUF")
    assert time.perf_counter() - t0 < 2
    msg = str(e.value)
    assert "ggml-org/gpt-oss-20b-GGUF/gpt-oss-20b-mxfp4.gguf" in msg and "HF_HUB_OFFLINE" in msg
    monkeypatch.setenv("GOOSEDUMP_MODEL", "someone/model-GGUF:model-q8.gguf")
    with pytest.raises(ModelNotFoundError, match="someone/model-GGUF/model-q8.gguf"):
        resolve_model(None)
    with pytest.raises(ModelNotFoundError, match="no such file"):
        resolve_model("./missing/model.gguf")


def test_model_name_found_in_the_hugging_face_cache(monkeypatch, tmp_path, tiny_path):
    # A file already in the standard cache layout is used without the network.
    snap = tmp_path / "models--ggml-org--gpt-oss-20b-GGUF" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (tmp_path / "models--ggml-org--gpt-oss-20b-GGUF" / "refs").mkdir()
    (tmp_path / "models--ggml-org--gpt-oss-20b-GGUF" / "refs" / "main").write_text("abc123")
    os.symlink(tiny_path, snap / "gpt-oss-20b-mxfp4.gguf")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))
    path = resolve_model(None)
    assert os.path.samefile(path, tiny_path)


def test_demo_runs_end_to_end(tmp_path):
    out = run_cli("demo", "--max-tokens", "8", env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "goosedump" / "demo-tiny.gguf").exists()
    assert "stop: max_tokens" in out.stderr and out.stdout


def test_tiny_model_with_the_120b_routing_shape(tmp_path, small_vocab):
    p = tmp_path / "t120.gguf"
    synth.write_model(p, "tiny-120b", vocab=small_vocab)
    model = goosedump.load(p)
    c = model.config
    assert (c.n_layer, c.n_expert, c.n_expert_used) == (36, 128, 4)
    r = model.generate([1, 2, 3, 4, 5], max_tokens=8, record_routing=True)
    assert r.generated_tokens == 8
    experts = np.concatenate([experts for _, _, experts in r.routing])
    assert experts.max() < 128 and len(np.unique(experts)) > 32   # routing spreads over the 128


def test_profile_parts_add_up(tiny_model):
    r = tiny_model.generate(PROMPT, max_tokens=10, profile=True)
    assert set(r.profile["phases"]) == {"prefill", "decode"}
    split = {phase: p["split"] for phase, p in r.profile["phases"].items()}
    for phase, p in split.items():
        parts = p["seconds"]
        assert set(parts) == {"attn_proj", "attention", "router", "experts", "output_head", "constraint", "other"}
        assert all(v >= 0 for v in parts.values())
        assert sum(parts.values()) == pytest.approx(p["total_seconds"], rel=1e-9)
        assert parts["attn_proj"] > 0 and parts["experts"] > 0 and parts["output_head"] > 0
    assert split["prefill"]["tokens"] == r.prompt_tokens - r.cached_tokens and split["decode"]["tokens"] == r.decode_steps
    # the forward passes are most of the decode time; the rest is the loop and text decoding
    assert split["decode"]["total_seconds"] <= r.decode_seconds
    assert "profile" in r.to_dict() and "profile" not in tiny_model.generate(PROMPT, max_tokens=2).to_dict()


def test_cli_penalties_and_a_banned_token(tiny_path, tiny_model):
    """run's --presence-penalty/--frequency-penalty (serve and the chat had
    them; run refused the flags) and -l ID-inf, a token never chosen, as
    llama.cpp reads it: the same tokens as the Python API's."""
    from goosedump.sampling import SamplingParams
    ids = tiny_model.tokenizer.encode(PROMPT)
    greedy = tiny_model.generate(ids, max_tokens=4, sampling=SamplingParams(temperature=0)).token_ids
    base = ("run", tiny_path, "--prompt-ids", ",".join(map(str, ids)), "-n", "4", "--json", "--temperature", "0")
    out = run_cli(*base, "-l", f"{greedy[0]}-inf")
    assert out.returncode == 0, out.stderr
    banned = SamplingParams(temperature=0, logit_bias={greedy[0]: float("-inf")})
    got = json.loads(out.stdout)["token_ids"]
    assert greedy[0] not in got and got == tiny_model.generate(ids, max_tokens=4, sampling=banned).token_ids
    kw = dict(temperature=1.0, seed=5, presence_penalty=1.5, frequency_penalty=-0.5)
    out = run_cli(*base[:-2], "--seed", "5", "--presence-penalty", "1.5", "--frequency-penalty", "-0.5")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["token_ids"] == tiny_model.generate(ids, 4, sampling=SamplingParams(**kw)).token_ids
    kw = dict(temperature=1.0, seed=5, repetition_penalty=1.5, presence_penalty=0.5, repeat_last_n=8)
    out = run_cli(*base[:-2], "--seed", "5", "--repeat-penalty", "1.5", "--presence-penalty", "0.5",
                  "--repeat-last-n", "8")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["token_ids"] == tiny_model.generate(ids, 4, sampling=SamplingParams(**kw)).token_ids
    bad = run_cli(*base, "--repeat-last-n", "-2")
    assert bad.returncode == 2 and "--repeat-last-n must be an integer >= -1" in bad.stderr
    bad = run_cli(*base, "--presence-penalty", "3")
    assert bad.returncode == 2 and "--presence-penalty" in bad.stderr and "Traceback" not in bad.stderr


def test_cli_run_profile(tiny_path):
    out = run_cli("run", tiny_path, "-p", PROMPT, "-n", "6", "--profile", "--temperature", "0")
    assert out.returncode == 0, out.stderr
    assert "where the time went" in out.stderr
    split, process = out.stderr.split("wall s", 1)        # the time split, then the process table
    rows = [line.split() for line in split.splitlines() if line.strip().startswith(("prefill ", "decode "))]
    assert [r[0] for r in rows] == ["prefill", "decode"]
    assert "peak RSS" in process and "expert routing:" in process
    for r in rows:   # tokens, six parts, total: the parts add up to the total
        values = [float(x) for x in r[2:]]
        # each printed to 2 decimals: half a unit of the last place apiece, and 1%
        assert sum(values[:-1]) == pytest.approx(values[-1], abs=0.005 * len(values) + 0.01 * values[-1])


def test_cli_bench_json(tiny_path):
    out = run_cli("bench", tiny_path, "-p", "16", "-n", "4", "-r", "2", "--json", "--threads", "1")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["prompt_tokens"] == 16 and r["gen_tokens"] == 4 and r["reps"] == 2 and len(r["runs"]) == 2
    assert r["prefill_tokens_per_s"] > 0 and r["decode_tokens_per_s"] > 0
    assert r["prefill_tokens_per_s_std"] >= 0 and r["decode_tokens_per_s_std"] >= 0
    assert r["threads"] == 1
    text = run_cli("bench", tiny_path, "-p", "16", "-n", "4", "-r", "1")
    assert "pp16" in text.stdout and "tg4 @ d16" in text.stdout
