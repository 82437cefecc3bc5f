"""The subcommands that run the model (goosedump.parser builds the parser,
goosedump.cli calls these; file_commands.py holds those about files and traces): each takes
the parsed arguments and returns the exit status; errors are raised as
exceptions that cli.main turns into one line. Their flags are checked and
read by arguments.py."""
from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import sys
import time

from .arguments import (UsageError, api_key_from, check_ctx, check_date, check_kv_fits, check_max_tokens,
                        check_output, check_prompt_cache_folder, check_threads, check_vocab, constraint_args,
                        context_for, flag_error, max_tokens, model_arg, prompt_flag, read_prompt, sampling_from,
                        think_args)
from .terminal import ReplyPrinter, print_cache, print_profile, print_reply, print_timings


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
    prompt_cache = check_prompt_cache_folder(prompt_cache, said, default=said == "the default prompt cache")
    options = Options.from_env(expert_cache=args.expert_cache, threads=threads,
                               page_cache=getattr(args, "page_cache", False), prompt_cache=prompt_cache,
                               prompt_cache_size=getattr(args, "prompt_cache_size", None),
                               huge_pages=getattr(args, "huge_pages", None))
    if isinstance(getattr(args, "max_batch", None), int):       # (serve: a KV cache per request decoded at once)
        options = dataclasses.replace(options, kv_caches=max(1, args.max_batch))
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


def say_budget(model) -> None:
    """What the expert cache budget is, decided now at the run's context
    (auto: from the memory available), said once the arguments are checked."""
    model.expert_budget
    if model.budget_note:
        print(f"goosedump: {model.budget_note}", file=sys.stderr)


def write_profile(path: str, model, profile: dict) -> None:
    """The profile as JSON for `goosedump plot` and for comparing runs."""
    doc = {**profile, "model": model.path}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    print(f"profile written to {path}", file=sys.stderr)



def cmd_run(args: argparse.Namespace) -> int:
    prompt = read_prompt(args)
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
    if isinstance(prompt, list):
        from .generate import check_prompt
        try:
            check_prompt(prompt, model.config.n_vocab)
        except ValueError as e:
            raise UsageError(f"--prompt-ids: {e}") from None
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
    first = prompt_flag(args)
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
    return run_chat(session, first=first)


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
    from .server.cors import CorsError, parse_origins
    try:
        parse_origins(args.cors_origins)
    except CorsError as e:
        raise UsageError(str(e)) from None
    from .server.hosts import HostsError, parse_hosts
    try:
        parse_hosts(args.allowed_hosts)
    except HostsError as e:
        raise UsageError(str(e)) from None
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
