"""The subcommands that run the model (goosedump.cli builds the parser and calls
these; file_commands.py holds those about files and traces): each takes
the parsed arguments and returns the exit status; errors are raised as
exceptions that cli.main turns into one line."""
from __future__ import annotations

import argparse
import errno
import io
import json
import os
import re
import sys
import time

from .limits import MAX_FLAG_FILE
from .terminal import ReplyPrinter, print_cache, print_profile, print_reply, print_timings


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


def load_model(args: argparse.Namespace):
    """The model the arguments name, with the runtime options they give;
    errors name the flags."""
    from .hub import resolve_model
    from .model import load
    from .options import Options
    threads = check_threads(args.threads)
    ctx = getattr(args, "ctx", None)
    check_ctx(ctx)
    # the prompt cache is on by default for run, chat and serve (the flag,
    # else the environment, else the user's cache folder); off elsewhere
    prompt_cache, said = getattr(args, "prompt_cache", "off"), "--prompt-cache"
    if prompt_cache is None:
        from .options import ENV_PROMPT_CACHE
        from .promptcache import default_folder
        env = os.environ.get(ENV_PROMPT_CACHE)
        prompt_cache, said = (env, f"${ENV_PROMPT_CACHE}") if env else (default_folder(), "the default prompt cache")
    check_prompt_cache_folder(prompt_cache, said)
    options = Options.from_env(expert_cache=args.expert_cache, threads=threads,
                               page_cache=getattr(args, "page_cache", False), prompt_cache=prompt_cache,
                               prompt_cache_size=getattr(args, "prompt_cache_size", None),
                               huge_pages=getattr(args, "huge_pages", None))
    model = load(resolve_model(model_arg(args)), options=options)
    model.on_note = lambda text: print(text, file=sys.stderr)
    if ctx is not None:
        said = getattr(args, "ctx_said", None)
        asked = ctx
        ctx = args.ctx = context_for(ctx, model.config.context_length, said)
        check_kv_fits(model.config, ctx, f"-c/--ctx {asked}" + (" (the model's context length)"
                                                                 if asked == 0 else ""))
        model.n_ctx = ctx
    return model


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


def say_budget(model) -> None:
    """What the expert cache budget is, decided now at the run's context
    (auto: from the memory available), said once the arguments are checked."""
    model.expert_budget
    if model.budget_note:
        print(f"goosedump: {model.budget_note}", file=sys.stderr)


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


def check_prompt_cache_folder(folder: str | None, flag: str = "--prompt-cache") -> None:
    """The prompt cache's folder: one that exists must be a folder (one that
    does not is made when the first entry is written)."""
    if folder and folder != "off" and os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageError(f"{flag} {folder}: not a folder (give a folder for the cache, or --no-prompt-cache)")


def write_profile(path: str, model, profile: dict) -> None:
    """The profile as JSON for `goosedump plot` and for comparing runs."""
    doc = {**profile, "model": model.path}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    print(f"profile written to {path}", file=sys.stderr)


# --- run -------------------------------------------------------------------------


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


def _read_prompt(args: argparse.Namespace):
    """The prompt the arguments give (text or token ids), or None for none:
    -p, -f/--prompt-file, --prompt-ids, words after the model (ollama's
    `run MODEL "prompt"`), else stdin when it is not a terminal."""
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
    elif given:
        text = given[0]
    elif sys.stdin.isatty():
        return None
    else:
        text = read_stdin("the prompt on stdin")
    if not text.strip():
        raise UsageError("the prompt is empty (-p, -f, the words after the model or stdin gave no text)")
    return text


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


def cmd_run(args: argparse.Namespace) -> int:
    prompt = _read_prompt(args)
    if prompt is None:          # no prompt on a terminal: chat, as ollama does
        if args.json or args.raw or args.routing_trace or args.profile_out or args.json_schema or args.grammar:
            raise UsageError("no prompt: give -p TEXT, -f FILE, --prompt-ids or the words after the model")
        return cmd_chat(args)
    # Token ids are a raw prompt by nature; text is a user message unless --raw.
    chat = not args.raw and not isinstance(prompt, list)
    if not chat and args.system is not None:
        raise UsageError("--system needs the chat format (leave out --raw and --prompt-ids)")
    sampling = sampling_from(args)
    date = check_date(args.date)
    check_max_tokens(args)
    think_args(args)
    constrain = constraint_args(args)
    if chat and getattr(args, "format", None) == "json":
        # JSON mode, as ollama's format "json" and OpenAI's json_object: any object, no schema to name
        constrain = {"response_format": {"type": "json_object"}}
    if args.reasoning_budget is not None:
        if args.reasoning_budget < 0:
            raise UsageError(f"--reasoning-budget must be 0 or more tokens, got {args.reasoning_budget}")
        if not chat:
            raise UsageError("--reasoning-budget needs the chat format (leave out --raw and --prompt-ids)")
    outputs = ((args.profile_out, "--profile-out"), (args.routing_trace, "--routing-trace"))
    for path, flag in outputs:
        check_output(path, flag)
    started = time.perf_counter()
    model = load_model(args)
    for path, flag in outputs:
        check_output(path, flag, model)
    check_vocab(sampling, model)
    say_budget(model)
    model.stepper             # (mapped now: --verbose's load duration)
    loaded = time.perf_counter()
    profile = args.profile or bool(args.profile_out)
    trace = bool(args.routing_trace)
    reply = None
    if chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
            [{"role": "user", "content": prompt}]
        # -n -1: the room the rendered prompt leaves (a schema's section included), as chat_stream counts it
        until_full = args.max_tokens == -1
        stream = model.chat_stream(messages, model.n_ctx if until_full else args.max_tokens,
                                   reasoning_effort=args.reasoning_effort, date=date, sampling=sampling,
                                   time_budget=args.time_budget, profile=profile, record_routing=trace,
                                   reasoning_budget=args.reasoning_budget, fit_context=until_full, **constrain)
        print_reply(stream, None if args.json else ReplyPrinter(show_reasoning=not args.hide_reasoning))
        r, reply = stream.result, stream.reply
    else:
        on_text = None
        if not args.json:
            def on_text(piece: str) -> None:
                sys.stdout.write(piece)
                sys.stdout.flush()
        n = len(prompt) if isinstance(prompt, list) else len(model.tokenizer.encode(prompt, allow_special=True))
        r = model.generate(prompt, max_tokens=max_tokens(args, model, n), time_budget=args.time_budget,
                           on_text=on_text, profile=profile, sampling=sampling, record_routing=trace, **constrain)
    if not args.json:
        sys.stdout.write("\n")      # the answer's own line ends before anything else is said
        sys.stdout.flush()
    if trace:
        from .cachesim import write_trace
        c = model.config
        write_trace(args.routing_trace, {"model": model.path, "slot_bytes": model.store.slot_bytes,
                                         "n_layer": c.n_layer, "n_expert": c.n_expert, "k": c.n_expert_used},
                    r.routing)
    if args.profile_out:
        write_profile(args.profile_out, model, r.profile)
    if args.json:
        d = r.to_dict()
        if not args.profile:
            d.pop("profile", None)
        if reply is not None:
            d["reply"] = {"content": reply.content, "reasoning_content": reply.reasoning_content,
                          "tool_calls": reply.tool_calls}
        print(json.dumps(d, ensure_ascii=False))
    else:
        if args.profile:
            print_profile(r.profile)
            print_cache(r.expert_cache)
        if args.verbose:
            print_timings(r, time.perf_counter() - started, loaded - started)
        # (the prefill's time and rate are those of the tokens it computed: a
        # cached prefix's are not, so the line says how many were)
        prefill = f"in {r.prefill_seconds:.2f} s ({r.prefill_tokens_per_s:.1f} tok/s)"
        if r.cached_tokens:
            prefill = (f"({r.cached_tokens} from the prompt cache; {r.prompt_tokens - r.cached_tokens} in "
                       f"{r.prefill_seconds:.2f} s, {r.prefill_tokens_per_s:.1f} tok/s)")
        print(f"[{r.prompt_tokens} prompt tokens {prefill}, "
              f"{r.generated_tokens} generated in {r.decode_seconds:.2f} s ({r.decode_tokens_per_s:.1f} tok/s), "
              f"stop: {r.stop_reason}]", file=sys.stderr)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from .repl import ChatSession, run_chat
    sampling = sampling_from(args)
    date = check_date(args.date)
    check_max_tokens(args)
    think_args(args)
    if args.reasoning_budget is not None and args.reasoning_budget < 0:
        raise UsageError(f"--reasoning-budget must be 0 or more tokens, got {args.reasoning_budget}")
    model = load_model(args)
    check_vocab(sampling, model)
    say_budget(model)
    session = ChatSession(model, system=args.system, reasoning_effort=args.reasoning_effort, date=date,
                          sampling=sampling, max_tokens=args.max_tokens, show_reasoning=not args.hide_reasoning,
                          profile=args.profile, reasoning_budget=args.reasoning_budget, verbose=args.verbose)
    return run_chat(session)


DEFAULT_MAX_BATCH = 4       # serve's --max-batch (-np), and what llama-server's -np -1 (auto) gives


def cmd_serve(args: argparse.Namespace) -> int:
    import socket
    if args.max_batch == -1:          # llama-server's -np -1: its own choice (here the default)
        args.max_batch = DEFAULT_MAX_BATCH
    if args.max_batch < 1:
        raise UsageError(f"--max-batch (-np) must be at least 1, or -1 for the default ({DEFAULT_MAX_BATCH}), "
                         f"got {args.max_batch}")
    from .budget import parse_size
    if isinstance(args.max_body_size, str):
        args.max_body_size = parse_size(args.max_body_size, "--max-body-size")
    if not args.body_timeout > 0:
        raise UsageError(f"--body-timeout must be more than 0 seconds, got {args.body_timeout}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {args.port}")
    from .server.metrics import api_keys
    from .server.params import request_defaults, template_kwargs_flag
    args.chat_template_kwargs = template_kwargs_flag(args.chat_template_kwargs)
    from .sampling import SamplingError
    try:
        args.request_defaults = request_defaults(args)
    except SamplingError as e:
        raise flag_error(e) from None
    if args.api_key_file is not None:        # (both: every key of both opens, as in llama-server)
        args.api_key = ",".join(k for k in (args.api_key, api_key_from(args.api_key_file)) if k)
    elif args.api_key and not api_keys(args.api_key):
        raise UsageError(f"--api-key {args.api_key!r} holds no key (several are comma-separated)")
    try:                        # a port in use is said before anything loads
        with socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET) as probe:
            probe.bind((args.host, args.port))
    except socket.gaierror as e:   # (the host, not the port: no such name or address)
        raise UsageError(f"--host {args.host}: {e.strerror or e} (an address of this machine, e.g. 127.0.0.1 "
                         f"or 0.0.0.0)") from None
    except OSError as e:
        if e.errno == errno.EADDRNOTAVAIL:
            raise UsageError(f"--host {args.host}: not an address of this machine ({e.strerror})") from None
        raise UsageError(f"--port {args.port} on {args.host}: {e.strerror or e} (another server may be "
                         f"listening there): choose another with --port") from None
    replicas = getattr(args, "replicas", None)
    if replicas is not None:
        from .server.replicas import ReplicaError, import_ray, parse_replicas
        try:
            parse_replicas(args)        # checked before anything loads
            import_ray()
        except ReplicaError as e:
            raise UsageError(str(e)) from None
    model = load_model(args)
    say_budget(model)
    if replicas is not None:
        from .server.replicas import ReplicaError, serve_replicas
        try:
            return serve_replicas(args, model)
        except ReplicaError as e:
            raise UsageError(str(e)) from None
    from .server import serve   # FastAPI and uvicorn load only for serve
    return serve(args, model)


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


def cmd_demo(args: argparse.Namespace) -> int:
    from .model import load
    from .synth import write_model
    if args.max_tokens < 1:                     # (before the model is written and loaded)
        raise UsageError(f"-n/--max-tokens must be at least 1, got {args.max_tokens}")
    folder = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "goosedump")
    path = os.path.join(folder, "demo-tiny.gguf")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        print(f"writing a tiny synthetic GPT-OSS model (random weights, real vocabulary) to {path}",
              file=sys.stderr)
        write_model(path, "tiny", seed=0, progress=True)
    model = load(path, threads=check_threads(args.threads))
    c = model.config
    print(f"model: {c.n_layer} layers, {c.n_expert} experts (top {c.n_expert_used}), hidden {c.n_embd}, "
          f"vocabulary {c.n_vocab}", file=sys.stderr)
    messages = [{"role": "user", "content": "Say hello."}]
    ids = model.render_chat(messages)
    print(f"chat prompt in the harmony format, {len(ids)} tokens:\n{model.tokenizer.decode(ids)}", file=sys.stderr)
    print("answer (random weights, so expect noise): ", end="", file=sys.stderr, flush=True)
    stream = model.chat_stream(messages, args.max_tokens)
    print_reply(stream, ReplyPrinter())
    r = stream.result
    sys.stdout.write("\n")                      # the answer ends its line, piped or not
    sys.stdout.flush()
    print(f"[prefill {r.prefill_tokens_per_s:.0f} tok/s, decode {r.decode_tokens_per_s:.0f} tok/s, "
          f"{r.generated_tokens} tokens, stop: {r.stop_reason}]", file=sys.stderr)
    return 0
