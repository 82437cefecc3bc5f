"""goosedump: run GPT-OSS models from their GGUF files on a CPU, in bounded memory."""
from __future__ import annotations

import argparse
import os
import sys

from . import commands
from .bench import cmd_bench
from .budget import ENV_EXPERT_CACHE, SizeError
from .commands import UsageError
from .gguf import GGUFError


def _add_expert_cache(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expert-cache", metavar="SIZE", default=None,
                   help=f"expert cache budget, an integer followed by M or G, 1M..16G "
                        f"(default: ${ENV_EXPERT_CACHE}, else 2G)")
    p.add_argument("--page-cache", action="store_true",
                   help="leave the experts' pages in the OS page cache after reading (faster while RAM is "
                        "free; the footprint is then bounded by the OS, not the budget)")


def _add_chat_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system", default=None, help="system message (for gpt-oss it becomes the developer "
                                                   "message's instructions, as openai-harmony maps it)")
    p.add_argument("--reasoning-effort", choices=["low", "medium", "high"], default="medium",
                   help="how long the model thinks (default medium)")
    p.add_argument("--date", default=None, metavar="YYYY-MM-DD",
                   help="the conversation's date in the system message (default today)")
    p.add_argument("--hide-reasoning", action="store_true", help="do not show the model's reasoning")


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature; 0 is greedy (default 1.0, as gpt-oss recommends)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0: off)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: off)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens less likely than min-p times the most likely (default 0: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="(default 1.0: off)")
    p.add_argument("--seed", type=int, default=None, help="random seed: the same seed gives the same output")


def _add_runtime(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ctx", type=int, default=None, help="context length (default min(4096, the model's))")
    p.add_argument("--threads", type=int, default=None, help="threads (default: one per core)")
    _add_expert_cache(p)


def _add_profile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", action="store_true",
                   help="report time, CPU, memory, page faults, reads and expert routing per phase "
                        "(with --json: a 'profile' key)")
    p.add_argument("--profile-out", metavar="FILE.json",
                   help="write the profile, per token where it varies, as JSON (for goosedump plot)")


ENV_API_KEY = "GOOSEDUMP_API_KEY"


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """goosedump serve's flags (here, so that --help needs no web stack)."""
    p.add_argument("model", help="GGUF file (or a Hugging Face repo id REPO[:FILE], as for goosedump run)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--api-key", metavar="KEY", default=os.environ.get(ENV_API_KEY),
                   help=f"require 'Authorization: Bearer KEY' on /v1/ (default: ${ENV_API_KEY}; unset: open)")
    p.add_argument("--expert-cache", metavar="SIZE", default=None,
                   help=f"expert cache budget, an integer followed by M or G, 1M..16G "
                        f"(default: ${ENV_EXPERT_CACHE}, else 2G)")
    p.add_argument("--page-cache", action="store_true",
                   help="leave the experts' pages in the OS page cache after reading")
    p.add_argument("--ctx", type=int, default=None, help="context length (default min(4096, the model's))")
    p.add_argument("--threads", type=int, default=None, help="threads (default: one per core)")
    p.add_argument("--model-name", metavar="NAME", default=None,
                   help="the model's id in the API (default: the file's name without .gguf)")
    p.add_argument("--max-batch", type=int, default=4,
                   help="requests the engine decodes together, where it can (default 4)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default info)")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    p = argparse.ArgumentParser(prog="goosedump", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--version", action="version", version=f"goosedump {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("synth", help="write a synthetic GPT-OSS GGUF (real layout and vocabulary, "
                                     "random weights)")
    from .recipes import DEFAULT_RECIPE, RECIPES
    from .synth import PRESETS
    s.add_argument("--preset", choices=sorted(PRESETS), required=True,
                   help="tiny (4 layers, 8 experts, a few MB), tiny-120b (120b's 36 layers x 128 experts at tiny "
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
    s.set_defaults(func=commands.cmd_synth)

    i = sub.add_parser("inspect", help="describe a model file and the memory a run needs")
    i.add_argument("model", help="GGUF file (any part of a split set), or a Hugging Face name as for run")
    _add_expert_cache(i)
    i.add_argument("--ctx", type=int, default=4096, help="context length for the estimate (default 4096)")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.set_defaults(func=commands.cmd_inspect)

    r = sub.add_parser("run", help="answer a prompt (in the chat format; --raw for plain completion)")
    r.add_argument("model", nargs="?", default=None,
                   help="GGUF file (any part of a split set), or a Hugging Face name: REPO, REPO:QUANT "
                        "(Q4_K_M, F16, ...) or REPO:FILE.gguf, fetched into the Hugging Face cache (default: "
                        "$GOOSEDUMP_MODEL, else ggml-org/gpt-oss-20b-GGUF)")
    r.add_argument("-p", "--prompt", help="the user's message (with --raw: text to continue, where special "
                                          "tokens such as <|start|> are recognised)")
    r.add_argument("--prompt-file", metavar="FILE", help="read the prompt from a file (- for stdin)")
    r.add_argument("--prompt-ids", metavar="IDS", help="comma-separated token ids, run raw (bypasses the "
                                                       "tokenizer and the chat format)")
    r.add_argument("--raw", action="store_true", help="plain completion of the prompt, no chat format")
    r.add_argument("-n", "--max-tokens", type=int, default=256, help="tokens to generate at most (default 256)")
    r.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop generating after this many seconds")
    r.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    _add_chat_options(r)
    _add_sampling(r)
    _add_runtime(r)
    r.add_argument("--routing-trace", metavar="FILE",
                   help="write the (token, layer, experts) routing of the run, for goosedump cache-sim")
    _add_profile(r)
    r.set_defaults(func=commands.cmd_run)

    ch = sub.add_parser("chat", help="chat with the model in the terminal")
    ch.add_argument("model", nargs="?", default=None, help="GGUF file or Hugging Face repo id (as for run)")
    ch.add_argument("-n", "--max-tokens", type=int, default=2048, help="tokens per answer at most (default 2048)")
    _add_chat_options(ch)
    _add_sampling(ch)
    _add_runtime(ch)
    ch.add_argument("--profile", action="store_true", help="after each answer, report where time, memory "
                                                          "and routing went")
    ch.set_defaults(func=commands.cmd_chat)

    b = sub.add_parser("bench", help="prefill and decode tokens/s with their spread (like llama-bench)")
    b.add_argument("model", nargs="?", default=None, help="GGUF file or Hugging Face repo id (as for run)")
    b.add_argument("-p", "--prompt-tokens", type=int, default=512, help="prompt length (default 512)")
    b.add_argument("-n", "--gen-tokens", type=int, default=128, help="tokens to decode (default 128)")
    b.add_argument("-r", "--reps", type=int, default=3, help="repetitions after one warm-up (default 3)")
    b.add_argument("--threads", type=int, default=None, help="threads (default: one per core)")
    _add_expert_cache(b)
    b.add_argument("--json", action="store_true", help="print one JSON object")
    _add_profile(b)
    b.set_defaults(func=cmd_bench)

    pl = sub.add_parser("plot", help="draw a profile (from --profile-out) as PNG pictures")
    pl.add_argument("profile", help="a JSON file written by run/bench --profile-out")
    pl.add_argument("--out", required=True, metavar="DIR", help="folder for the pictures (created if missing)")
    pl.set_defaults(func=commands.cmd_plot)

    cs = sub.add_parser("cache-sim", help="replay a routing trace against each cache policy and budget")
    cs.add_argument("trace", help="a file written by goosedump run --routing-trace")
    cs.add_argument("--budget", action="append", metavar="SIZE",
                    help="expert cache budget (repeatable; default 1G, 2G, 4G)")
    cs.add_argument("--slot-bytes", type=int, default=None, help="bytes per expert slot (default: the trace's)")
    cs.add_argument("--json", action="store_true")
    cs.set_defaults(func=commands.cmd_cache_sim)

    sv = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API (see docs/server.md)")
    add_serve_arguments(sv)
    sv.set_defaults(func=commands.cmd_serve)

    pu = sub.add_parser("pull", help="download a model by name into the Hugging Face cache, without running it")
    pu.add_argument("model", help="REPO, REPO:QUANT (Q4_K_M, F16, MXFP4, ...) or REPO:FILE.gguf; a split set "
                                  "downloads all its parts")
    pu.set_defaults(func=commands.cmd_pull)

    ls = sub.add_parser("list", help="the GGUF models in the Hugging Face cache, with their sizes")
    ls.add_argument("--json", action="store_true", help="print one JSON object")
    ls.set_defaults(func=commands.cmd_list)

    d = sub.add_parser("demo", help="write a tiny synthetic model into the cache and run it end to end")
    d.add_argument("--max-tokens", type=int, default=32)
    d.add_argument("--threads", type=int, default=None)
    d.set_defaults(func=commands.cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (GGUFError, SizeError, FileNotFoundError, UsageError, ValueError, OSError) as e:
        print(f"goosedump: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
