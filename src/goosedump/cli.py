"""The command line's entry, main(): the parser (parser.py) applied,
llama.cpp's habits (llamacpp_flags) and errors on one line; commands.py,
file_commands.py, bench.py and server/ run the subcommands (arguments.py
checks what they take from the flags).
llama.cpp's and ollama's spellings are accepted beside goosedump's own:
-m/--model, -c/--ctx-size, -t/--threads, -s/--seed (-1: random), -f/--file,
--n-predict (-1: until the end), --temp, --repeat-penalty, ollama's --think,
--hidethinking, --format json, --verbose, and `goosedump run MODEL "prompt"`;
llama.cpp's -hf/-hff, -sys, -c 0, serve's -np and request defaults, and the
flags goosedump ignores with a note (llamacpp_flags)."""
from __future__ import annotations

import argparse
import os
import sys

from . import llamacpp_flags
from .arguments import UsageError
from .budget import SizeError
from .gguf import GGUFError
from .parser import ENV_API_KEY, build_parser


def unknown_flags(sub: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The flags in argv that the subcommand does not know (before argparse
    complains of a missing argument instead)."""
    out = []
    opts = sub._option_string_actions
    value_next = False
    for a in argv:
        if a == "--":
            break
        if value_next:              # a flag's value, whatever it starts with (-p "- a list", -l -5)
            value_next = False
            continue
        if a.startswith("-") and len(a) > 1 and not a.lstrip("-").replace(".", "", 1).isdigit():
            flag = a.split("=", 1)[0]
            if any(ch.isspace() for ch in flag):
                continue            # words, not a flag: a prompt's own text
            # (-n5, -t2: a short flag and its value joined; but letters after
            # one, -mli, -hft, -sp, are llama.cpp's longer flags, which argparse
            # would read as -m li, -h -f t, -s p)
            joined = not flag.startswith("--") and flag[:2] in opts and not flag[2:].replace("-", "").isalpha()
            known = flag in opts or (flag.startswith("--") and any(o.startswith(flag) for o in opts)) or joined
            if not known:
                out.append(a)
            elif flag in opts and "=" not in a and opts[flag].nargs != 0:
                value_next = True
    return out


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has left (not another pipe,
    a socket's, that broke)."""
    import select
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _serve_environment(parser, serve, argv: list[str], args: argparse.Namespace) -> argparse.Namespace:
    """serve's arguments with llama-server's LLAMA_ARG_* variables for the
    flags the command line leaves out (llamacpp_flags.from_environment): a
    flag given in any spelling wins over its variable; a model (word, -m,
    --hf-file) or key (--api-key, --api-key-file) given in any form takes
    none of its group's variables; $GOOSEDUMP_API_KEY wins over theirs."""
    rest = argv[argv.index("serve") + 1:]
    given = llamacpp_flags.given_dests(serve, rest)
    # a group given in any of its forms takes none of the environment's
    for group in ({"model", "model_opt", "hf_file"}, {"api_key", "api_key_file"}):
        if given & group:
            given |= group
    if os.environ.get(ENV_API_KEY):
        given |= {"api_key", "api_key_file"}
    words, said = llamacpp_flags.from_environment(serve, os.environ, given)
    if not words:
        return args
    print(said, file=sys.stderr)
    return parser.parse_args(argv + words)


def main(argv: list[str] | None = None) -> int:
    parser, subs = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    # ollama's --think takes its value only as --think=VALUE (alone: true), so
    # the word after a bare --think is the prompt's, as ollama reads it
    for a, word in zip(argv, argv[1:]):
        if a == "--think" and word.lower() in ("true", "false", "low", "medium", "high"):
            print(f"goosedump: --think takes its value after '=' (--think={word.lower()}), as ollama's: "
                  f"'{word}' is read as the prompt's first word", file=sys.stderr)
    argv = llamacpp_flags.normalise(["--think=true" if a == "--think" else a for a in argv])
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in subs:   # an unknown flag: the subcommand's own usage, not the top level's
        rest = argv[argv.index(command) + 1:]
        bad = unknown_flags(subs[command], rest)
        if bad:
            subs[command].error(f"unrecognized arguments: {' '.join(bad)}")
    args, extra = parser.parse_known_args(argv)
    if args.command is None:       # `goosedump` alone: what it can do, not argparse's one line
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        parser.print_help(sys.stderr)
        return 2
    if getattr(args, "hf_token", None):
        os.environ["HF_TOKEN"] = args.hf_token      # (llama.cpp's -hft: huggingface_hub reads it there)
    if extra and args.command == "run" and not any(a.startswith("-") for a in extra):
        # `run MODEL -n 64 "prompt"`: argparse gives the positional words only
        # their first run (up to the first flag); the words after a flag are
        # the prompt's too, in the order typed (ollama and llama.cpp take them)
        args.words += extra
        extra = []
    if extra:
        subs[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "serve":
            args = _serve_environment(parser, subs["serve"], argv, args)
        llamacpp_flags.check(args)
        said = llamacpp_flags.note(args)
        if said:
            print(said, file=sys.stderr)
        return args.func(args)
    except BrokenPipeError as e:
        if _stdout_gone():         # (`goosedump run ... | head`: the reader had enough; quiet, as a shell's tools)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        print(f"goosedump: error: {e}", file=sys.stderr)
        return 2
    except (GGUFError, SizeError, FileNotFoundError, UsageError, ValueError, OSError) as e:
        print(f"goosedump: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:       # (an allocation this machine refused: say what, not a traceback)
        print(f"goosedump: error: out of memory: {str(e) or 'an allocation failed'}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
