"""llama.cpp's flags, so that a command copied from llama-server's,
llama-cli's or llama-bench's documentation (`llama-server -m MODEL -c 0
-fa on --jinja -ngl 99`) runs unchanged. Three kinds:
- another spelling of a flag of ours (-np/--parallel is --max-batch, -sys
  is --system, -hf REPO names the model, ...): parser.py adds those beside ours;
- flags about what goosedump does its own way (GPU offload, batch sizes,
  flash attention, memory locking, the Jinja engine, KV cache types): taken
  and ignored (`add_ignored`), and said in one line at start (`note`);
- flags whose llama.cpp meaning goosedump cannot give (--chat-template,
  --reasoning-format none): refused by name (`check`)."""
from __future__ import annotations

import argparse

# topic -> (what --help calls it, why the note says it is ignored)
TOPICS = {
    "gpu": ("GPU offload and flash attention",
            "goosedump runs on the CPU, its experts streamed from the file through the expert cache (--expert-cache)"),
    "batch": ("batch sizes", "goosedump sizes its prefill steps itself"),
    "threads": ("batch threads", "-t/--threads serve prefill and decode alike"),
    "memory": ("memory mapping and locking",
               "the weights are mapped from the file, the experts held by the expert cache (--expert-cache, "
               "--page-cache)"),
    "template": ("the Jinja engine",
                 "goosedump renders gpt-oss's harmony format as openai-harmony does, other models' embedded "
                 "templates with Jinja"),
    "kv": ("KV cache types and layout", "goosedump keeps the KV cache in its own format"),
    "warmup": ("warm-up", "the weights are mapped at start"),
    "batching": ("continuous batching", "goosedump always decodes requests together (--max-batch)"),
    "server": ("llama-server's routes and timeouts",
               "goosedump always serves /metrics and /props, no /slots and no web page, times bodies by "
               "--body-timeout and always reuses a cached prompt prefix (--prompt-cache)"),
    "conversation": ("conversation mode", "`goosedump run` answers once, `goosedump chat` converses"),
    "parallel": ("parallel sequences",
                 "`goosedump run` and `chat` answer one conversation; `goosedump serve` decodes requests together "
                 "(-np/--max-batch)"),
}

# (option strings, number of values: 0, 1 or "?", topic)
ANYWHERE = [
    (("-ngl", "--gpu-layers", "--n-gpu-layers"), 1, "gpu"),
    (("-fa", "--flash-attn"), "?", "gpu"),
    (("-sm", "--split-mode"), 1, "gpu"),
    (("-ts", "--tensor-split"), 1, "gpu"),
    (("-mg", "--main-gpu"), 1, "gpu"),
    (("-dev", "--device"), 1, "gpu"),
    (("-ncmoe", "--n-cpu-moe"), 1, "gpu"),
    (("-cmoe", "--cpu-moe"), 0, "gpu"),
    (("-ot", "--override-tensor"), 1, "gpu"),
    (("-nkvo", "--no-kv-offload"), 0, "gpu"),
    (("-b", "--batch-size"), 1, "batch"),
    (("-ub", "--ubatch-size"), 1, "batch"),
    (("-tb", "--threads-batch"), 1, "threads"),
    (("--mlock",), 0, "memory"),
    (("--no-mmap",), 0, "memory"),
    (("--numa",), 1, "memory"),
    (("--jinja",), 0, "template"),
    (("-ctk", "--cache-type-k"), 1, "kv"),
    (("-ctv", "--cache-type-v"), 1, "kv"),
    (("--no-warmup",), 0, "warmup"),
]
SERVER = [
    (("-cb", "--cont-batching"), 0, "batching"),
    (("--metrics",), 0, "server"),
    (("--slots",), 0, "server"),
    (("--no-webui",), 0, "server"),
    (("-to", "--timeout"), 1, "server"),
    (("--cache-reuse",), 1, "server"),
    (("-kvu", "--kv-unified"), 0, "kv"),
    (("--swa-full",), 0, "kv"),
]
CHAT = [
    (("-cnv", "--conversation"), 0, "conversation"),
    (("-no-cnv", "--no-conversation", "-st", "--single-turn"), 0, "conversation"),
    # (serve takes -np as --max-batch; here argparse would read -np 4 as -n p)
    (("-np", "--parallel"), 1, "parallel"),
]
BENCH = [
    (("-mmp", "--mmap"), 1, "memory"),
]
FLASH_VALUES = ("on", "off", "auto", "0", "1", "true", "false")
REASONING_FORMATS = ("auto", "deepseek")


class _Ignored(argparse.Action):
    """Records the flag and its value for `note`."""

    def __call__(self, parser, namespace, values, option_string=None):
        got = list(getattr(namespace, "llamacpp_ignored", None) or [])
        got.append((option_string, values if isinstance(values, str) else None, self.const))
        namespace.llamacpp_ignored = got


def add_ignored(p: argparse.ArgumentParser, *groups: list) -> None:
    """The flags of groups, taken and ignored (hidden from --help, which says
    so in one line of the command's description)."""
    p.set_defaults(llamacpp_ignored=[])
    for group in groups:
        for flags, n, topic in group:
            p.add_argument(*flags, action=_Ignored, nargs={0: 0, 1: None}.get(n, n), const=TOPICS[topic][1],
                           default=None, metavar="V", help=argparse.SUPPRESS,
                           dest=f"ignored{flags[-1].replace('-', '_')}")


def help_text(*groups) -> str:
    """The ignored flags for --help, by topic."""
    by_topic: dict[str, list[str]] = {}
    for group in groups:
        for flags, _, topic in group:
            by_topic.setdefault(topic, []).append("/".join(flags))
    return ("llama.cpp's flags for what goosedump does its own way are taken and ignored, with a note saying "
            "so: " + "; ".join(f"{TOPICS[t][0]}: {', '.join(f)}" for t, f in by_topic.items()) + ".")


def add_reasoning_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reasoning-format", default=None, metavar="FORMAT", help=argparse.SUPPRESS)
    p.add_argument("--chat-template", "--chat-template-file", dest="chat_template", default=None,
                   help=argparse.SUPPRESS)


def normalise(argv: list[str]) -> list[str]:
    """-fa's value is optional in old llama.cpp and required in new: a value
    after it is taken into it (-fa on -> --flash-attn=on), a bare -fa is
    on, so that the word after a bare -fa (a prompt's) is not read as its."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("-fa", "--flash-attn"):
            if i + 1 < len(argv) and argv[i + 1].lower() in FLASH_VALUES:
                out.append(f"--flash-attn={argv[i + 1]}")
                i += 2
                continue
            out.append("--flash-attn=on")
        else:
            out.append(a)
        i += 1
    return out


def check(args: argparse.Namespace) -> None:
    """Refuse what goosedump cannot do as llama.cpp means it (a ValueError
    names the flag)."""
    fmt = getattr(args, "reasoning_format", None)
    if fmt is not None and fmt not in REASONING_FORMATS:
        raise ValueError(f"--reasoning-format {fmt}: goosedump returns the reasoning apart from the answer "
                         f"(reasoning_content), as llama.cpp's 'auto' and 'deepseek' do; "
                         f"'{fmt}' is not supported (use auto, or leave the flag out)")
    if getattr(args, "chat_template", None) is not None:
        raise ValueError(f"--chat-template {args.chat_template}: {TOPICS['template'][1]}, and takes no other "
                         "template")


def note(args: argparse.Namespace) -> str | None:
    """One line naming the llama.cpp flags ignored, each group with why."""
    ignored = getattr(args, "llamacpp_ignored", None)
    if not ignored:
        return None
    by_reason: dict[str, list[str]] = {}
    for flag, value, why in ignored:
        by_reason.setdefault(why, []).append(flag if value is None else f"{flag} {value}")
    parts = [f"{', '.join(flags)}: {why}" for why, flags in by_reason.items()]
    return "goosedump: ignoring llama.cpp's " + "; ".join(parts)


# llama-server's environment variables (LLAMA_ARG_*, as its Docker images are
# configured) for the flags `goosedump serve` takes, ours or ignored: a
# variable gives its flag where the command line does not (llama.cpp's rule:
# the command line wins). A flag without a value is given by on, enabled,
# true or 1, and left out by any other word.
SERVER_ENV = [
    ("LLAMA_ARG_MODEL", "-m"), ("LLAMA_ARG_HF_REPO", "-hf"), ("LLAMA_ARG_HF_FILE", "-hff"),
    ("LLAMA_ARG_HOST", "--host"), ("LLAMA_ARG_PORT", "--port"), ("LLAMA_API_KEY", "--api-key"),
    ("LLAMA_ARG_API_KEY_FILE", "--api-key-file"), ("LLAMA_ARG_CTX_SIZE", "-c"), ("LLAMA_ARG_THREADS", "-t"),
    ("LLAMA_ARG_ALIAS", "-a"), ("LLAMA_ARG_N_PARALLEL", "-np"), ("LLAMA_ARG_N_PREDICT", "-n"),
    ("LLAMA_ARG_CHAT_TEMPLATE_KWARGS", "--chat-template-kwargs"), ("LLAMA_ARG_THINK_BUDGET", "--reasoning-budget"),
    ("LLAMA_ARG_TEMPERATURE", "--temp"), ("LLAMA_ARG_TOP_K", "--top-k"), ("LLAMA_ARG_TOP_P", "--top-p"),
    ("LLAMA_ARG_MIN_P", "--min-p"), ("LLAMA_ARG_REPEAT_PENALTY", "--repeat-penalty"),
    ("LLAMA_ARG_PRESENCE_PENALTY", "--presence-penalty"), ("LLAMA_ARG_FREQUENCY_PENALTY", "--frequency-penalty"),
    ("LLAMA_ARG_THINK", "--reasoning-format"), ("LLAMA_ARG_CHAT_TEMPLATE", "--chat-template"),
    ("LLAMA_ARG_CHAT_TEMPLATE_FILE", "--chat-template-file"),
    # taken and ignored, as their flags are
    ("LLAMA_ARG_N_GPU_LAYERS", "-ngl"), ("LLAMA_ARG_FLASH_ATTN", "-fa"), ("LLAMA_ARG_BATCH", "-b"),
    ("LLAMA_ARG_UBATCH", "-ub"), ("LLAMA_ARG_CONT_BATCHING", "-cb"), ("LLAMA_ARG_ENDPOINT_METRICS", "--metrics"),
    ("LLAMA_ARG_ENDPOINT_SLOTS", "--slots"), ("LLAMA_ARG_JINJA", "--jinja"), ("LLAMA_ARG_CACHE_TYPE_K", "-ctk"),
    ("LLAMA_ARG_CACHE_TYPE_V", "-ctv"), ("LLAMA_ARG_KV_UNIFIED", "-kvu"), ("LLAMA_ARG_SWA_FULL", "--swa-full"),
    ("LLAMA_ARG_TIMEOUT", "-to"), ("LLAMA_ARG_CACHE_REUSE", "--cache-reuse"), ("LLAMA_ARG_NUMA", "--numa"),
    ("LLAMA_ARG_DEVICE", "-dev"), ("LLAMA_ARG_SPLIT_MODE", "-sm"), ("LLAMA_ARG_TENSOR_SPLIT", "-ts"),
    ("LLAMA_ARG_MAIN_GPU", "-mg"), ("LLAMA_ARG_N_CPU_MOE", "-ncmoe"), ("LLAMA_ARG_CPU_MOE", "-cmoe"),
    ("LLAMA_ARG_OVERRIDE_TENSOR", "-ot"),
]
TRUTHY = ("on", "enabled", "true", "1")
SECRET = ("LLAMA_API_KEY",)


def given_dests(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The dests the command line (a subcommand's words) sets, however
    spelled (-c8192, --po 8080, the default's own value), and the ignored
    flags it names: parsed with every default a marker."""
    marker = object()
    ns = argparse.Namespace(**{a.dest: marker for a in parser._actions if a.dest != argparse.SUPPRESS})
    ns.llamacpp_ignored = []
    parser.parse_known_args(argv, namespace=ns)
    # (an optional positional is set to its default when absent: given only with another value)
    positional = {a.dest: a.default for a in parser._actions if not a.option_strings}
    given = {d for d, v in vars(ns).items() if v is not marker and d != "llamacpp_ignored"
             and not (d in positional and v == positional[d])}
    by_flag = {s: a.dest for a in parser._actions for s in a.option_strings}
    return given | {by_flag[flag] for flag, _, _ in ns.llamacpp_ignored if flag in by_flag}


def from_environment(parser: argparse.ArgumentParser, environ, given: set[str]) -> tuple[list[str], str | None]:
    """The command-line words SERVER_ENV's variables give for the flags whose
    dests `given` (given_dests, and what wins over the environment) leaves
    out, and a line naming them. A flag without a value is set by a truthy
    word and otherwise left off, as llama.cpp reads it; a value that is not
    of its flag's type is a ValueError naming the variable."""
    actions = parser._option_string_actions
    words, said = [], []
    for var, flag in SERVER_ENV:
        value = environ.get(var)
        action = actions.get(flag)
        if value is None or action is None or action.dest in given:
            continue
        if action.nargs == 0:
            if value.lower() not in TRUTHY:
                continue
            new = [flag]
        else:
            if action.type is not None:
                try:
                    action.type(value)
                except (TypeError, ValueError):
                    kind = getattr(action.type, "__name__", "value")
                    raise ValueError(f"{var}={value}: {flag} takes {'an' if kind[0] in 'aeiou' else 'a'} {kind}"
                                     ) from None
            new = [f"{flag}={value}"]
        words += new
        said.append(f"{flag}{'' if action.nargs == 0 else ' ' + ('***' if var in SECRET else value)} ({var})")
    return words, ("goosedump: from llama.cpp's environment: " + ", ".join(said)) if said else None
