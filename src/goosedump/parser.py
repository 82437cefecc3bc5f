"""goosedump's command line: the parser of every subcommand, its flags in
groups (the model, the expert cache, sampling, the chat format, the
runtime, serve's), with llama.cpp's and ollama's spellings beside
goosedump's own (llamacpp_flags adds the flags it ignores or refuses).
cli.main parses with it; each subcommand's function is set as its default."""
from __future__ import annotations

import argparse
import functools
import os
import textwrap

from . import commands, file_commands, llamacpp_flags
from .bench import cmd_bench
from .budget import ENV_EXPERT_CACHE

DESCRIPTION = "goosedump: run GPT-OSS models from their GGUF files on a CPU, in bounded memory."
MODEL_HELP = ("GGUF file (any part of a split set), or a Hugging Face name: REPO, REPO:QUANT (Q4_K_M, F16, ...) or "
              "REPO:FILE.gguf, fetched into the Hugging Face cache (default: $GOOSEDUMP_MODEL, else "
              "ggml-org/gpt-oss-20b-GGUF)")
ENV_API_KEY = "GOOSEDUMP_API_KEY"
THINK = ("true", "false", "low", "medium", "high")
SERVE_SUMMARY = """endpoints (OpenAI's shapes and errors):
  GET  /v1/models                 the served model
  POST /v1/chat/completions       messages, tools (strict: true constrains the arguments), tool_choice,
                                  response_format (json_schema, json_object), reasoning_effort, stream,
                                  stream_options, max_tokens / max_completion_tokens, temperature, top_p,
                                  top_k, min_p, seed, stop, logit_bias, presence/frequency/repetition_penalty,
                                  repeat_last_n, temperature_last; llama.cpp's grammar and json_schema;
                                  reasoning_budget; n (up to 8 choices)
  POST /v1/completions            prompt (text or token ids, or a batch of them), the same sampling fields, n,
                                  grammar, json_schema, response_format, echo with logprobs (the prompt's
                                  tokens scored, as evaluation harnesses ask)
  POST /v1/responses              input, instructions, tools, text.format, reasoning.effort,
                                  max_output_tokens, stream
  POST /v1/responses/input_tokens, /v1/chat/completions/input_tokens   the prompt's tokens, counted
  GET  /health, GET /metrics      liveness; Prometheus counters (per replica)
  POST /completion                llama.cpp's own: prompt, n_predict, its sampling names and samplers order,
                                  grammar, json_schema, n_probs
  POST /tokenize, /detokenize, /apply-template; GET /props   llama.cpp's token and template routes
ollama's API beside it (ollama's shapes and errors; newline-delimited JSON streams by default):
  POST /api/chat, /api/generate   messages, tools, format, think, options (temperature, top_p, top_k, min_p,
                                  seed, num_predict, stop, repeat/presence/frequency_penalty, repeat_last_n),
                                  stream
  GET  /api/tags, /api/ps, /api/version; POST /api/show
Anthropic's Messages API beside them (Anthropic's shapes, events and errors):
  POST /v1/messages               messages (text, thinking, tool_use, tool_result blocks), system, max_tokens,
                                  tools, tool_choice, thinking, output_config, stop_sequences, stream
  POST /v1/messages/count_tokens
replies carry reasoning_content beside content; usage counts cached prompt tokens; every response names
its replica in X-Goosedump-Replica. Point the openai client at http://HOST:PORT/v1 (api_key: the
--api-key, or any string without one); an ollama or anthropic client at http://HOST:PORT. llama-server's
names without /v1 (/chat/completions, /responses, /models, /completions, /v1/health) answer too, and its
LLAMA_ARG_* variables (LLAMA_ARG_PORT, LLAMA_ARG_CTX_SIZE, LLAMA_API_KEY, ...) give the flags they name
where the command line does not (printed at start)."""


REFUSED_HELP = """--reasoning-format auto and deepseek are what goosedump does (the reasoning apart from the
answer), none is refused; so are --chat-template and --chat-template-file."""


def _epilog(*groups, chat: bool = True) -> str:
    text = llamacpp_flags.help_text(llamacpp_flags.ANYWHERE, *groups)
    return textwrap.fill(text, 100, break_on_hyphens=False) + ("\n" + REFUSED_HELP if chat else "")


def _add_model(p: argparse.ArgumentParser, positional: bool = True) -> None:
    if positional:
        p.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    p.add_argument("-m", "--model", "-hf", "-hfr", "--hf-repo", dest="model_opt", metavar="MODEL", default=None,
                   help="the model, as a flag (llama.cpp's spelling; -hf REPO[:QUANT] too)")
    p.add_argument("-hff", "--hf-file", dest="hf_file", metavar="FILE", default=None,
                   help="with -hf REPO: the file in it (llama.cpp's flag; the same as the name REPO:FILE)")
    p.add_argument("-hft", "--hf-token", dest="hf_token", metavar="TOKEN", default=None,
                   help="the Hugging Face token for a gated or private repo (llama.cpp's flag; default $HF_TOKEN)")


def _add_expert_cache(p: argparse.ArgumentParser, budget_only: bool = False) -> None:
    """--expert-cache; with budget_only (inspect, which runs nothing) not the
    flags of how a run reads its weights."""
    p.add_argument("--expert-cache", metavar="SIZE|auto", default=None,
                   help=f"expert cache budget: an integer followed by M or G (1M..1024G), or auto: every expert in "
                        f"memory where they fit beside the dense weights, KV cache and scratch in the memory "
                        f"available (the memory cgroup's limit or MemAvailable, less a margin of 768 MiB + 5%%), "
                        f"else that room as the cache, streaming the rest; printed at start "
                        f"(default: ${ENV_EXPERT_CACHE}, else auto)")
    if budget_only:
        return
    p.add_argument("--page-cache", action="store_true",
                   help="leave the experts' pages in the OS page cache after reading (faster while RAM is "
                        "free; the footprint is then bounded by the OS, not the budget)")
    p.add_argument("--no-huge-pages", dest="huge_pages", action="store_false", default=None,
                   help="leave the weights in the page cache as they are: by default those it holds in 4 KiB "
                        "pages (a file just downloaded or written) are read again, once, into 2 MiB pages, "
                        "which decode faster (also: GOOSEDUMP_HUGE_PAGES=off)")


def _add_chat_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system", "-sys", "--system-prompt", dest="system", default=None,
                   help="system message (for gpt-oss it becomes the developer message's instructions, as "
                        "openai-harmony maps it; -sys/--system-prompt: llama.cpp's spelling)")
    p.add_argument("--reasoning-effort", choices=["low", "medium", "high"], default="medium",
                   help="how long the model thinks (default medium)")
    p.add_argument("--date", default=None, metavar="YYYY-MM-DD",
                   help="the conversation's date in the system message (default today)")
    p.add_argument("--hide-reasoning", "--hidethinking", dest="hide_reasoning", action="store_true",
                   help="do not show the model's reasoning (--hidethinking: ollama's spelling)")
    p.add_argument("--reasoning-budget", type=int, default=None, metavar="N",
                   help="end the reasoning after N tokens (0: answer at once; default: no limit)")
    p.add_argument("--think", choices=THINK, default=None, metavar="=true|false|low|medium|high",
                   help="ollama's spelling (--think alone is --think=true): a level is --reasoning-effort, false "
                        "is --reasoning-budget 0 (no reasoning), true changes nothing (gpt-oss always reasons)")
    p.add_argument("--verbose", action="store_true",
                   help="after each answer, its counts and timings as ollama prints them (total and load "
                        "duration, prompt eval count, duration and rate, eval count, duration and rate)")


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", "--temp", type=float, default=1.0,
                   help="sampling temperature; 0 is greedy (default 1.0, as gpt-oss recommends)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0: off)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: off)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens less likely than min-p times the most likely (default 0: off)")
    p.add_argument("--repetition-penalty", "--repeat-penalty", type=float, default=1.0,
                   help="divide the positive logits of tokens already seen (prompt and answer) by this and "
                        "multiply the negative ones, as transformers does (default 1.0: off; llama.cpp's counts "
                        "only the last 64 tokens: --repeat-last-n 64)")
    p.add_argument("--repeat-last-n", type=int, default=None, metavar="N",
                   help="llama.cpp's penalties: the three count only the last N tokens of prompt and answer "
                        "(-1: all of them, 0: no penalties; default: transformers' and OpenAI's, the repetition "
                        "penalty over all, presence and frequency over the answer)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtract this from the logits of tokens the answer has used, as OpenAI's API does "
                        "(-2 to 2, default 0: off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtract this times each token's count in the answer from its logit, as OpenAI's API "
                        "does (-2 to 2, default 0: off)")
    p.add_argument("-l", "--logit-bias", action="append", default=[], metavar="TOKEN_ID(+|-)BIAS",
                   help="add BIAS to the token's logit, as llama.cpp spells it: 15043+1, 15043-1.5, 15043-inf "
                        "(never this token; repeatable)")
    p.add_argument("-s", "--seed", type=int, default=None,
                   help="random seed: the same seed gives the same output (-1 or none: a random one)")


def _add_runtime(p: argparse.ArgumentParser, ctx_default: str = "min(4096, the model's)") -> None:
    p.add_argument("-c", "--ctx", "--ctx-size", dest="ctx", type=int, default=None,
                   help=f"context length in tokens; 0: the model's own, as in llama.cpp (default {ctx_default})")
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="kernel threads (default, or 0: one per core)")
    _add_expert_cache(p)
    p.add_argument("--prompt-cache", metavar="DIR", default=None,
                   help="keep the KV state of prompts on disk in DIR, so that a prompt seen before (the same "
                        "system prompt and tools, a conversation set aside) prefills only what is new; off: "
                        "don't (default: $GOOSEDUMP_PROMPT_CACHE, else the user's cache folder, "
                        "$XDG_CACHE_HOME/goosedump/prompt-cache, ~/.cache/goosedump/prompt-cache without it)")
    p.add_argument("--no-prompt-cache", dest="prompt_cache", action="store_const", const="off",
                   help="the same as --prompt-cache off")
    p.add_argument("--prompt-cache-size", metavar="SIZE", default=None,
                   help="the prompt cache's cap on disk, least recently used entries evicted past it "
                        "(default: $GOOSEDUMP_PROMPT_CACHE_SIZE, else 4G)")


def _add_llamacpp(p: argparse.ArgumentParser, *groups) -> None:
    """llama.cpp's flags for a command that chats or serves (llamacpp_flags)."""
    llamacpp_flags.add_reasoning_format(p)
    llamacpp_flags.add_ignored(p, llamacpp_flags.ANYWHERE, *groups)


def _add_profile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", action="store_true",
                   help="report time, CPU, memory, page faults, reads and expert routing per phase "
                        "(with --json: a 'profile' key)")
    p.add_argument("--profile-out", metavar="FILE.json",
                   help="write the profile, per token where it varies, as JSON (for goosedump plot)")


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """goosedump serve's flags (here, so that --help needs no web stack)."""
    _add_model(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--api-key", metavar="KEY", default=os.environ.get(ENV_API_KEY),
                   help=f"require 'Authorization: Bearer KEY' (or x-api-key: KEY) on /v1/ (but /v1/health), /api/ "
                        f"(but /api/version) and llama.cpp's /completion, /tokenize, /detokenize, /apply-template, "
                        f"/props; several keys comma-separated, as llama-server takes them (default: "
                        f"${ENV_API_KEY}; unset: open)")
    p.add_argument("--api-key-file", metavar="FILE", default=None,
                   help="the API keys in FILE, a key a line, lines starting with # comments (llama-server's "
                        "flag), so that they are not in the command line; with --api-key, the keys of both")
    _add_runtime(p)
    p.add_argument("--model-name", "-a", "--alias", dest="model_name", metavar="NAME", default=None,
                   help="the model's id in the API (-a/--alias: llama.cpp's spelling; default: the file's name "
                        "without .gguf)")
    p.add_argument("--chat-template-kwargs", metavar="JSON", default=None,
                   help="defaults for every request's chat_template_kwargs (llama.cpp's flag): a JSON object with "
                        "reasoning_effort (low, medium, high), model_identity (the system message's first line), "
                        "enable_thinking (false: no reasoning), e.g. '{\"reasoning_effort\": \"high\"}'; a "
                        "request's own fields win")
    p.add_argument("--max-batch", "-np", "--parallel", dest="max_batch", type=int,
                   default=commands.DEFAULT_MAX_BATCH,
                   help="requests the engine decodes together, where it can (-np/--parallel: llama.cpp's "
                        f"spelling; default, or -1 as llama-server's auto: {commands.DEFAULT_MAX_BATCH})")
    p.add_argument("--max-body-size", metavar="SIZE", default="16M",
                   help="refuse request bodies larger than this with a 413, before reading them whole "
                        "(an integer followed by M or G; default 16M)")
    p.add_argument("--body-timeout", metavar="SECONDS", type=float, default=20.0,
                   help="answer 408 to a request whose body stops arriving for this long (default 20)")
    p.add_argument("--cors-origins", metavar="LIST", default="local",
                   help="origins whose web pages may call the server from a browser (CORS), comma-separated: "
                        "scheme://host[:port], local (http and https on localhost, 127.0.0.1 and [::1], any "
                        "port, and desktop apps' schemes), '*' (any: llama-server's behaviour) or off (none); a "
                        "page of another origin is refused (default: local, as ollama)")
    p.add_argument("--allowed-hosts", metavar="LIST", default="local",
                   help="on a loopback --host, the Host names answered besides addresses, localhost, this "
                        "machine's name and names under .localhost, .local and .internal (a web page that rebinds "
                        "its own name to 127.0.0.1 is refused, as by ollama): comma-separated names, *.example.com "
                        "for those under it (checked on any --host), or '*' for any (default: local)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default info)")
    d = p.add_argument_group("request defaults (llama-server's flags): what a request that does not say gets; "
                             "its own fields win")
    d.add_argument("--temperature", "--temp", type=float, default=None, help="(default 1.0, as gpt-oss recommends)")
    d.add_argument("--top-p", type=float, default=None, help="(default 1.0: off)")
    d.add_argument("--top-k", type=int, default=None, help="(default 0: off)")
    d.add_argument("--min-p", type=float, default=None, help="(default 0: off)")
    d.add_argument("--repetition-penalty", "--repeat-penalty", type=float, default=None, help="(default 1.0: off)")
    d.add_argument("--presence-penalty", type=float, default=None, help="(default 0: off)")
    d.add_argument("--frequency-penalty", type=float, default=None, help="(default 0: off)")
    d.add_argument("--repeat-last-n", type=int, default=None, metavar="N",
                   help="the penalties' window, as llama.cpp's (-1: the whole context, 0: no penalties; default: "
                        "the repetition penalty over everything, presence and frequency over the answer)")
    d.add_argument("-s", "--seed", type=int, default=None, help="(default: a random one per request; -1 too)")
    d.add_argument("-n", "--n-predict", dest="n_predict", type=int, default=None,
                   help="tokens to generate at most (default, or -1: until the reply ends or the context is full)")
    d.add_argument("--reasoning-budget", type=int, default=None, metavar="N",
                   help="reasoning tokens at most (0: none; default, or -1: no limit)")
    _add_llamacpp(p, llamacpp_flags.SERVER)
    r = p.add_argument_group("replicas (Ray Serve; pip install 'goosedump[ray]')")
    r.add_argument("--replicas", metavar="N|auto", default=None,
                   help="serve N replicas of the engine behind this endpoint on Ray Serve (each with its own "
                        "--threads, --expert-cache and --max-batch), or auto: as many as the load needs between "
                        "--min-replicas and --max-replicas; requests with an X-Session-Id header stay on one "
                        "replica (its KV cache); default: one process, no Ray")
    r.add_argument("--min-replicas", type=int, default=1, help="with --replicas auto: the fewest (default 1)")
    r.add_argument("--max-replicas", type=int, default=2, help="with --replicas auto: the most (default 2)")
    r.add_argument("--ray-address", metavar="ADDR", default=None,
                   help="join this Ray cluster (e.g. ray://head:10001 or auto) instead of starting a local one")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser and each subcommand's own (for its usage on an unknown flag).
    Built once per process for each value of $GOOSEDUMP_API_KEY (its one
    input from the environment, --api-key's default): argparse takes 9 ms
    to build it, as long as a tiny model's whole run, which a process that
    calls main() again and again (the file fuzzer's workers) paid each time.
    Parsing leaves a parser as it was."""
    return _build_parser(os.environ.get(ENV_API_KEY))


def _add_escape(p: argparse.ArgumentParser) -> None:
    p.add_argument("-e", "--escape", action="store_true", default=True,
                   help="read -p's escapes (\\n \\t \\\\ \\xHH ...) as llama.cpp does: the default")
    p.add_argument("--no-escape", dest="escape", action="store_false", help="take -p's backslashes as typed")


@functools.lru_cache(maxsize=4)
def _build_parser(api_key: str | None) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from . import __version__
    p = argparse.ArgumentParser(prog="goosedump", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"goosedump {__version__}")
    sub = p.add_subparsers(dest="command")     # (none: main prints the help)
    subs: dict[str, argparse.ArgumentParser] = {}

    def add(name: str, help: str, func, **kw) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help, **kw)
        sp.set_defaults(func=func)
        for word in (name, *kw.get("aliases", ())):
            subs[word] = sp
        return sp

    r = add("run", "answer a prompt in the chat format (--raw: plain completion); with no prompt on a "
                   "terminal, chat", commands.cmd_run,
            epilog=_epilog(llamacpp_flags.CHAT), formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("words", nargs="*", metavar="MODEL [PROMPT ...]",
                   help=f"the model, then the user's message as words (ollama's spelling; text piped to stdin "
                        f"goes before them, as ollama puts it). MODEL: {MODEL_HELP}")
    _add_model(r, positional=False)
    r.add_argument("-p", "--prompt", help="the user's message (with --raw: text to continue, where special "
                                          "tokens such as <|start|> are recognised)")
    _add_escape(r)
    r.add_argument("-f", "--file", "--prompt-file", dest="prompt_file", metavar="FILE",
                   help="read the prompt from a file (- for stdin)")
    r.add_argument("--prompt-ids", metavar="IDS", help="comma-separated token ids, run raw (bypasses the "
                                                       "tokenizer and the chat format)")
    r.add_argument("--raw", action="store_true", help="plain completion of the prompt, no chat format")
    r.add_argument("-n", "--max-tokens", "--n-predict", dest="max_tokens", type=int, default=256,
                   help="tokens to generate at most (default 256; -1: until the end of generation or the context)")
    r.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop generating after this many seconds")
    r.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    r.add_argument("-j", "--json-schema", metavar="FILE|JSON", default=None,
                   help="the answer follows this JSON schema (a file, or the schema itself): the final channel's "
                        "text in the chat format, the whole output with --raw; the reasoning stays free")
    r.add_argument("--grammar", "--grammar-file", dest="grammar", metavar="FILE", default=None,
                   help="the answer follows this grammar file (GBNF as llama.cpp writes it, or Lark)")
    r.add_argument("--format", choices=["json"], default=None,
                   help="ollama's spelling: json makes the answer a JSON object (-j '{\"type\": \"object\"}')")
    _add_chat_options(r)
    _add_sampling(r)
    _add_runtime(r)
    _add_llamacpp(r, llamacpp_flags.CHAT)
    r.add_argument("--routing-trace", metavar="FILE",
                   help="write the (token, layer, experts) routing of the run, for goosedump cache-sim")
    _add_profile(r)

    ch = add("chat", "chat with the model in the terminal", commands.cmd_chat,
             epilog=_epilog(llamacpp_flags.CHAT), formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_model(ch)
    ch.add_argument("-p", "--prompt", help="a first message, answered before the chat goes on (llama-cli's -p in "
                                           "its conversation mode)")
    _add_escape(ch)
    ch.add_argument("-n", "--max-tokens", "--n-predict", dest="max_tokens", type=int, default=2048,
                    help="tokens per answer at most (default 2048; -1: until the end of generation or the context)")
    _add_chat_options(ch)
    _add_sampling(ch)
    _add_runtime(ch)
    _add_llamacpp(ch, llamacpp_flags.CHAT)
    ch.add_argument("--profile", action="store_true", help="after each answer, report where time, memory "
                                                          "and routing went")

    sv = add("serve", "serve the model over OpenAI-, ollama- and Anthropic-compatible HTTP APIs", commands.cmd_serve,
             epilog=SERVE_SUMMARY + "\n" + _epilog(llamacpp_flags.SERVER),
             formatter_class=argparse.RawDescriptionHelpFormatter)
    add_serve_arguments(sv)

    b = add("bench", "prefill and decode tokens/s with their spread (like llama-bench; comma lists give one "
                     "row per combination)", cmd_bench,
            epilog=_epilog(llamacpp_flags.BENCH, chat=False),
            formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_model(b)
    b.add_argument("-p", "--prompt-tokens", "--n-prompt", dest="prompt_tokens", default="512", metavar="N[,N...]",
                   help="prompt length(s) (default 512)")
    b.add_argument("-n", "--gen-tokens", "--n-gen", dest="gen_tokens", default="128", metavar="N[,N...]",
                   help="tokens to decode: tgN times N one-token forward passes after the "
                        "prefill, as llama-bench; 0: the prefill alone (default 128)")
    b.add_argument("-t", "--threads", default=None, metavar="N[,N...]", help="threads (default, or 0: one per core)")
    b.add_argument("-r", "--reps", "--repetitions", dest="reps", type=int, default=3,
                   help="repetitions after one warm-up (default 3)")
    _add_expert_cache(b)
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("-o", "--output", choices=["md", "json"], default=None,
                   help="llama-bench's spelling: md the table (the default), json as --json")
    _add_profile(b)
    llamacpp_flags.add_ignored(b, llamacpp_flags.ANYWHERE, llamacpp_flags.BENCH)

    i = add("inspect", "describe a model file and the memory a run needs (ollama's show)", file_commands.cmd_inspect,
            aliases=["show"])
    _add_model(i)
    _add_expert_cache(i, budget_only=True)
    i.add_argument("-c", "--ctx", "--ctx-size", dest="ctx", type=int, default=None,
                   help="context length for the estimate; 0: the model's own (default min(4096, the model's), as "
                        "run's)")
    i.add_argument("--json", action="store_true", help="print one JSON object")

    pu = add("pull", "download a model by name into the Hugging Face cache, without running it", file_commands.cmd_pull)
    _add_model(pu)
    ls = add("list", "the GGUF models in the Hugging Face cache, with their sizes", file_commands.cmd_list,
             aliases=["ls"])
    ls.add_argument("--json", action="store_true", help="print one JSON object")

    from .recipes import DEFAULT_RECIPE, RECIPES
    from .synth import PRESETS
    s = add("synth", "write a synthetic GPT-OSS GGUF (real layout and vocabulary, random weights)",
            file_commands.cmd_synth)
    s.add_argument("--preset", choices=sorted(PRESETS), required=True,
                   help="tiny (4 layers, 8 experts, 41 MB), tiny-120b (120b's 36 layers x 128 experts at tiny "
                        "widths), 20b (the real layout: 12.1 GB in the mxfp4 recipe), 120b (about 65 GB)")
    s.add_argument("--out", required=True, help="output file (a split set: its parts are named after it, "
                                                "NAME-00001-of-0000N.gguf ...)")
    s.add_argument("--recipe", choices=list(RECIPES), default=DEFAULT_RECIPE,
                   help="each tensor's type, as the files users download have them: " +
                        "; ".join(f"{k}: {v[3]}" for k, v in RECIPES.items()) + f" (default {DEFAULT_RECIPE})")
    s.add_argument("--split-max-size", metavar="SIZE", default=None,
                   help="write a split set, each part at most SIZE of tensor data (N followed by M or G, "
                        "decimal as llama-gguf-split takes it: 2G = 2,000,000,000 bytes)")
    s.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    s.add_argument("--routing", choices=["uniform", "skewed"], default="uniform",
                   help="skewed: router biases make a few experts popular and reused token after token, "
                        "as in trained models (default: uniform)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")

    pl = add("plot", "draw a profile (from --profile-out) as PNG pictures", file_commands.cmd_plot)
    pl.add_argument("profile", help="a JSON file written by run/bench --profile-out")
    pl.add_argument("--out", default=None, metavar="DIR",
                    help="folder for the pictures (created if missing; default: the profile's own folder)")

    cs = add("cache-sim", "replay a routing trace against each cache policy and budget", file_commands.cmd_cache_sim)
    cs.add_argument("trace", help="a file written by goosedump run --routing-trace")
    cs.add_argument("--budget", action="append", metavar="SIZE",
                    help="expert cache budget (repeatable; default: 1/8, 1/4 and 1/2 of the trace model's "
                         "experts)")
    cs.add_argument("--slot-bytes", type=int, default=None, help="bytes per expert slot (default: the trace's)")
    cs.add_argument("--json", action="store_true", help="print one JSON object (the hit rate of each policy "
                                                        "and budget)")

    d = add("demo", "write a tiny synthetic model into the cache and run it end to end", commands.cmd_demo)
    d.add_argument("-n", "--max-tokens", type=int, default=32, help="tokens to generate (default 32)")
    d.add_argument("-t", "--threads", type=int, default=None, help="kernel threads (default, or 0: one per core)")
    return p, subs
