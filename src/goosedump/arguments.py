"""What the subcommands take from their flags, checked before anything
loads: each error a UsageError that names the flag and the value it got
(cli.main says it on one line); and the texts flags name (a prompt, a
schema, a grammar, a key file), read within MAX_FLAG_FILE."""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import sys

from .limits import MAX_FLAG_FILE


class UsageError(ValueError):
    pass


# Sampling parameters as the flags spell them (their errors name the flag).
SAMPLING_FLAGS = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p",
                  "repetition_penalty": "--repetition-penalty", "presence_penalty": "--presence-penalty",
                  "frequency_penalty": "--frequency-penalty", "seed": "--seed", "repeat_last_n": "--repeat-last-n"}


def flag_error(e) -> UsageError:
    """A SamplingError said of its flag (its message starts with the
    parameter's name)."""
    name, _, rest = str(e).partition(" ")
    return UsageError(f"{SAMPLING_FLAGS.get(name, name)} {rest}")


def model_arg(args: argparse.Namespace) -> str | None:
    """The model the arguments name: -m/--model (-hf REPO with -hff FILE:
    REPO:FILE), else the positional one; both named is an error (one would
    be dropped silently)."""
    opt, positional = getattr(args, "model_opt", None), getattr(args, "model", None)
    if opt is not None and positional is not None and opt != positional:
        raise UsageError(f"two models named: {positional} and -m/-hf {opt}; name one")
    name = opt or positional
    hf_file = getattr(args, "hf_file", None)
    if hf_file is not None:
        repo = getattr(args, "model_opt", None)
        if not repo or not re.fullmatch(r"[\w.-]+/[\w.-]+", repo) or os.path.exists(repo):
            raise UsageError(f"-hff/--hf-file {hf_file} needs -hf REPO (a repository's name, such as "
                             f"ggml-org/gpt-oss-20b-GGUF), got {repo or 'no -hf'}")
        return f"{args.model_opt}:{hf_file}"
    return name


def check_threads(threads: int | None) -> int | None:
    if threads is None:
        return None
    if threads < 0:
        raise UsageError(f"-t/--threads must be 0 (one per core) or more, got {threads}")
    cores = os.cpu_count() or 1
    if threads > cores:
        print(f"goosedump: warning: -t/--threads {threads} is more than this machine's {cores} cores: the threads "
              f"take turns on them, which is slower, not faster", file=sys.stderr)
    return threads


def check_ctx(ctx: int | None) -> None:
    """-c/--ctx before the model loads: 0 (the model's own) or more."""
    if ctx is not None and ctx < 0:
        raise UsageError(f"-c/--ctx must be at least 1 (or 0: the model's own context length), got {ctx}")


def context_for(ctx: int, context_length: int, said: str | None = None) -> int:
    """-c/--ctx against the model's context length (0, llama.cpp's: the
    context the model was trained for); said: what asked for it, where not
    the flag itself."""
    if ctx == 0:
        return context_length
    if ctx > context_length:
        raise UsageError(f"{said or f'-c/--ctx {ctx}'} is more than the model's context length {context_length}")
    return ctx


def check_kv_fits(config, ctx: int, said: str) -> None:
    """The KV cache of ctx positions fits this machine's memory (a file's
    context_length of 2^40 had failed in numpy's allocation, a traceback)."""
    import psutil
    from .budget import format_bytes
    from .kvcache import kv_bytes
    need, total = kv_bytes(config, ctx), psutil.virtual_memory().total
    if need > total:
        raise UsageError(f"{said}: the KV cache of {ctx} tokens takes {format_bytes(need)}, more than this "
                         f"machine's {format_bytes(total)} of memory: pass a smaller -c/--ctx")


def check_max_tokens(args: argparse.Namespace) -> None:
    """-n/--max-tokens, checked before anything loads."""
    n = args.max_tokens
    if n < 1 and n != -1:
        raise UsageError(f"-n/--max-tokens must be at least 1, or -1 (until the end of generation or the "
                         f"context), got {n}")
    budget = getattr(args, "time_budget", None)
    if budget is not None and not (budget > 0 and budget != float("inf")):
        raise UsageError(f"--time-budget must be a number of seconds above 0, got {budget}")


def max_tokens(args: argparse.Namespace, model, n_prompt: int) -> int:
    """-n/--max-tokens; -1: as many as the context leaves."""
    check_max_tokens(args)
    return max(1, model.n_ctx - n_prompt) if args.max_tokens == -1 else args.max_tokens


def sampling_from(args: argparse.Namespace):
    from .sampling import SamplingError, SamplingParams
    seed = args.seed
    if seed is not None and seed < -1:
        raise UsageError(f"-s/--seed must be a non-negative integer, or -1 for a random one, got {seed}")
    bias = {}
    for text in getattr(args, "logit_bias", None) or []:
        m = re.fullmatch(r"\s*(\d+)\s*([+-]\s*(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf))\s*", text)
        if not m:
            raise UsageError(f"-l/--logit-bias takes TOKEN_ID+BIAS or TOKEN_ID-BIAS (for example 15043+1, "
                             f"15043-1.5, or 15043-inf: never this token), got {text!r}")
        bias[int(m.group(1))] = float(m.group(2).replace(" ", ""))
    try:
        return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                              repetition_penalty=args.repetition_penalty, logit_bias=bias,
                              presence_penalty=getattr(args, "presence_penalty", 0.0),
                              frequency_penalty=getattr(args, "frequency_penalty", 0.0),
                              repeat_last_n=getattr(args, "repeat_last_n", None),
                              seed=None if seed == -1 else seed)
    except SamplingError as e:
        raise flag_error(e) from None


def check_vocab(sampling, model) -> None:
    """-l/--logit-bias's token ids against the model's vocabulary."""
    from .sampling import SamplingError
    try:
        sampling.check_vocab(model.config.n_vocab)
    except SamplingError as e:
        raise UsageError(str(e).replace("logit_bias", "-l/--logit-bias", 1)) from None


def check_date(date: str | None) -> str | None:
    import datetime as dt
    if date is None:
        return None
    try:
        dt.date.fromisoformat(date)
    except ValueError:
        raise UsageError(f"--date must be a real date YYYY-MM-DD, got {date!r}") from None
    return date


def check_output(path: str | None, flag: str, model=None) -> None:
    """An output file a flag names (--profile-out, --routing-trace), checked
    before the run that would fill it: not a folder, in a folder that is
    there and writable, and never the model's own file (or a part of it)."""
    if not path:
        return
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a folder; name a file to write")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {path}: not writable")
    if model is not None and os.path.exists(path):
        for part in model.file.parts:
            if os.path.samefile(path, part.path):
                raise UsageError(f"{flag} {path}: that is the model's file; name another to write")


def check_prompt_cache_folder(folder: str | None, flag: str = "--prompt-cache", default: bool = False) -> str | None:
    """The prompt cache's folder (one that does not exist is made when the
    first entry is written). One that is not a folder: an error naming it
    where the user gave it (the flag, the variable), else (the default
    folder, which the user never chose) "off" with one note, as a folder
    that cannot be read or written: it costs the cache, never the run."""
    if folder and folder != "off" and os.path.exists(folder) and not os.path.isdir(folder):
        if not default:
            raise UsageError(f"{flag} {folder}: not a folder (give a folder for the cache, or --no-prompt-cache)")
        print(f"goosedump: note: {flag} {folder}: not a folder; the prompt cache is off for this run",
              file=sys.stderr)
        return "off"
    return folder


def read_text(f, said: str, hint: str = "") -> str:
    """The text of f (opened as UTF-8 text), at most MAX_FLAG_FILE of it:
    one that is not UTF-8 named by the byte where it fails, one past the cap
    (/dev/zero, a model file given by mistake) by its size."""
    try:
        text = f.read(MAX_FLAG_FILE + 1)
    except UnicodeDecodeError as e:
        raise UsageError(f"{said}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if len(text) > MAX_FLAG_FILE:
        raise UsageError(f"{said}: more than {MAX_FLAG_FILE >> 20} MiB of text{hint}")
    return text


def read_flag_file(path: str, flag: str, unreadable: str = "{}") -> str:
    """The text of the file a flag names (-f, -j, --grammar), as read_text
    reads it; one it cannot open is named by `unreadable` (its {} the reason)."""
    try:
        with open(path, encoding="utf-8") as f:
            return read_text(f, f"{flag} {path}", "; is it the right file?")
    except OSError as e:
        raise UsageError(f"{flag} {path}: {unreadable.format(e.strerror or e)}") from None


def read_prompt(args: argparse.Namespace):
    """The prompt the arguments give (text or token ids), or None for none:
    -p (its escapes read as llama.cpp reads them, unless --no-escape),
    -f/--prompt-file, --prompt-ids, words after the model (ollama's `run
    MODEL "prompt"`, after what is piped to stdin, as ollama puts it), else
    stdin when it is not a terminal."""
    words = list(args.words)
    if args.model_opt is None and words:
        args.model_opt = words.pop(0)          # the first word is the model
    given = [x for x in (args.prompt, args.prompt_file, args.prompt_ids, " ".join(words) or None) if x is not None]
    if len(given) > 1:
        raise UsageError("give one prompt: -p/--prompt, -f/--prompt-file, --prompt-ids or words after the model")
    if args.prompt_ids is not None:
        try:
            return [int(x) for x in args.prompt_ids.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids!r}") from None
    if args.prompt_file is not None:
        text = read_stdin("-f -") if args.prompt_file == "-" else read_flag_file(args.prompt_file, "-f/--file")
    elif args.prompt is not None:
        text = prompt_flag(args)
    elif given:
        piped = piped_stdin()
        text = given[0] if not piped else f"{piped} {given[0]}"
    elif sys.stdin.isatty():
        return None
    else:
        text = read_stdin("the prompt on stdin")
    if not text.strip():
        raise UsageError("the prompt is empty (-p, -f, the words after the model or stdin gave no text)")
    return text


def prompt_flag(args: argparse.Namespace) -> str | None:
    """-p as the model reads it: its escapes read as llama.cpp reads them,
    unless --no-escape."""
    if args.prompt is None:
        return None
    return process_escapes(args.prompt) if args.escape else args.prompt


ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}


def process_escapes(text: str) -> str:
    """llama.cpp's escapes in -p (its string_process_escapes): \\n \\r \\t
    \\' \\" \\\\ and \\xHH (a byte); any other backslash stays as typed."""
    raw = text.encode("utf-8", "surrogateescape")
    out, i, n = bytearray(), 0, len(raw)
    while i < n:
        c = raw[i:i + 1]
        if c == b"\\" and i + 1 < n:
            e = chr(raw[i + 1])
            if e in ESCAPES:
                out += ESCAPES[e].encode()
                i += 2
                continue
            hex2 = raw[i + 2:i + 4]
            if e == "x" and i + 3 < n and re.fullmatch(rb"[0-9a-fA-F]{2}", hex2):
                out.append(int(hex2, 16))
                i += 4
                continue
            out += raw[i:i + 2]
            i += 2
            continue
        out += c
        i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        if raw.decode("utf-8", "replace") != text:     # (bytes as typed that are no UTF-8: left as they came)
            return out.decode("utf-8", "surrogateescape")
        raise UsageError("-p: its \\x escapes make no UTF-8 text (give the bytes of whole characters, or "
                         "--no-escape)") from None


def piped_stdin(wait: float = 2.0) -> str | None:
    """What is piped to stdin beside a prompt's words (ollama puts it before
    them), or None: stdin a terminal, empty, or silent for `wait` seconds
    (a pipe held open by a parent that sends nothing: said, not waited on)."""
    import select
    if sys.stdin is None or sys.stdin.isatty():
        return None
    try:
        ready, _, _ = select.select([sys.stdin.fileno()], [], [], wait)
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    if not ready:
        print(f"goosedump: stdin is not a terminal but sent nothing in {wait:g} s: not read (the prompt is the "
              "words given)", file=sys.stderr)
        return None
    text = read_stdin("the text piped to stdin")
    return text if text.strip() else None


def read_stdin(said: str) -> str:
    """Standard input as the prompt, as read_flag_file reads a file (UTF-8
    whatever the locale, newlines as text mode reads them)."""
    f = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8")
    try:
        return read_text(f, said)
    finally:
        f.detach()               # (stdin's own buffer stays open)


def think_args(args: argparse.Namespace) -> None:
    """ollama's --think (and its level) as --reasoning-effort and --reasoning-budget."""
    think = getattr(args, "think", None)
    if think in ("low", "medium", "high"):
        args.reasoning_effort = think
    elif think == "false":
        if args.reasoning_budget not in (None, 0):
            raise UsageError(f"--think=false means no reasoning; --reasoning-budget {args.reasoning_budget} "
                             "asks for some: give one of them")
        args.reasoning_budget = 0


def constraint_args(args: argparse.Namespace) -> dict:
    """--json-schema (a file or the schema's JSON), --format json and --grammar
    (a file) as the generation's keyword arguments, checked before the model
    loads."""
    from .structured import ConstraintError, as_grammar, schema_grammar
    kw = {}
    if getattr(args, "format", None) == "json":
        if args.json_schema is not None or args.grammar is not None:
            raise UsageError("give --format json, -j/--json-schema or --grammar, not two of them")
        args.json_schema = '{"type": "object"}'
    if args.json_schema is not None and args.grammar is not None:
        raise UsageError("give -j/--json-schema or --grammar, not both")
    if args.json_schema is not None:
        text = args.json_schema
        if not text.lstrip().startswith("{"):
            text = read_flag_file(text, "-j/--json-schema", "not a file ({}) nor a JSON object")
        try:
            kw["json_schema"] = json.loads(text)
            schema_grammar(kw["json_schema"], f"-j/--json-schema {args.json_schema}")
        except json.JSONDecodeError as e:
            raise UsageError(f"-j/--json-schema {args.json_schema}: not valid JSON: {e}") from None
        except ConstraintError as e:
            raise UsageError(str(e)) from None
    if args.grammar is not None:
        try:
            kw["grammar"] = as_grammar(read_flag_file(args.grammar, "--grammar"), f"--grammar {args.grammar}")
        except ConstraintError as e:
            raise UsageError(str(e)) from None
    return kw


def api_key_from(path: str) -> str:
    """serve's --api-key-file, as llama-server reads it: a key a line, lines
    starting with # are comments; the keys as --api-key takes several (comma-separated)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--api-key-file {path}: {getattr(e, 'strerror', None) or e}") from None
    keys = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not keys:
        raise UsageError(f"--api-key-file {path}: holds no key (a key a line; lines starting with # are comments)")
    if any(len(k) > 4096 for k in keys):
        raise UsageError(f"--api-key-file {path}: a line is longer than 4096 characters (a key is one line)")
    return ",".join(keys)
