"""llama.cpp's flags, so that a command copied from llama-server's,
llama-cli's or llama-bench's documentation (`llama-server -m MODEL -c 0
-fa on --jinja -ngl 99`) runs unchanged. Three kinds:
- another spelling of a flag of ours (-np/--parallel is --max-batch, -sys
  is --system, -hf REPO names the model, ...): cli.py adds those beside ours;
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
