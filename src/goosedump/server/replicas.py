"""`goosedump serve MODEL --replicas N|auto`: the same application as the
single-process server (create_app: the same routes, errors, streaming, API
key and per-replica metrics) deployed as Ray Serve replicas behind one
endpoint.

Each replica is a Ray Serve deployment replica whose ASGI app is built on
the replica (`serve.ingress(builder)`): it loads the model with the
replica's own --threads, --expert-cache and --max-batch, declared to Ray as
its CPU and memory needs, so Ray places replicas where they fit and routes
to a replica only once its model is loaded. Requests that carry an
`X-Session-Id` header go to the replica whose KV cache holds their
conversation (a consistent-hash ring over the replicas, Ray's own
ConsistentHashRouter), the others to the less loaded of the replicas;
scaling down waits for the requests in flight (Ray's graceful shutdown); a
replica that dies loses only the requests it was serving, and Ray restarts
it. Ray is an optional dependency (`pip install 'goosedump[ray]'`); nothing
here is imported by the plain server.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading

from .hosts import checked_hosts

APP_NAME = "goosedump"
ROUTER = "goosedump.server.affinity:SessionAffinityRouter"
# a replica being stopped (scale down, shutdown) finishes what it serves for this long
GRACEFUL_SHUTDOWN_S = 300


class ReplicaError(RuntimeError):
    pass


def import_ray():
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ReplicaError("--replicas needs Ray Serve: pip install 'goosedump[ray]' (or 'ray[serve]')") from None
    return ray, serve


def replica_spec(args: argparse.Namespace, model) -> dict:
    """What a replica needs to build its app, as plain values (sent to Ray)."""
    return {"model": model.path, "ctx": args.ctx, "threads": args.threads, "expert_cache": args.expert_cache,
            "page_cache": getattr(args, "page_cache", False), "max_batch": args.max_batch,
            "api_key": args.api_key, "model_name": args.model_name,
            "prompt_cache": model.options.prompt_cache or "off", "prompt_cache_bytes": model.options.prompt_cache_bytes,
            "max_body_bytes": args.max_body_size, "body_timeout": args.body_timeout,
            "cors_origins": args.cors_origins, "allowed_hosts": checked_hosts(args.host, args.allowed_hosts),
            "chat_template_kwargs": args.chat_template_kwargs,
            "defaults": dataclasses.asdict(args.request_defaults)}


def build_replica_app(spec: dict):
    """The replica's ASGI app: the model loaded here, the single server's
    app around it, with the replica's name on every response."""
    from ray import serve

    from ..model import load
    from ..options import Options
    from .app import create_app
    from .params import RequestDefaults
    ctx = serve.get_replica_context()
    replica = getattr(ctx.replica_id, "unique_id", None) or str(ctx.replica_id)
    options = dataclasses.replace(
        Options.from_env(expert_cache=spec["expert_cache"], threads=spec["threads"], page_cache=spec["page_cache"],
                         prompt_cache=spec["prompt_cache"]),
        prompt_cache_bytes=spec["prompt_cache_bytes"], kv_caches=spec["max_batch"])
    model = load(spec["model"], n_ctx=spec["ctx"], options=options)
    model.stepper             # map the weights now: the replica is routed to once this returns
    name = spec["model_name"] or os.path.basename(model.path).removesuffix(".gguf")
    app = create_app(model, model_name=name, api_key=spec["api_key"], max_batch=spec["max_batch"],
                     max_body_bytes=spec["max_body_bytes"], body_timeout=spec["body_timeout"],
                     chat_template_kwargs=spec["chat_template_kwargs"], defaults=RequestDefaults(**spec["defaults"]),
                     cors_origins=spec["cors_origins"], allowed_hosts=spec["allowed_hosts"], replica=f"{replica}@{os.uname().nodename}:{os.getpid()}")
    _LIVE["server"] = app.state.server
    return app


_LIVE: dict = {}


def check_health() -> None:
    """Ray's health check of a replica: its engine thread must be alive."""
    server = _LIVE.get("server")
    if server is not None and not server.engine.alive:
        raise RuntimeError("the engine thread of this replica has stopped")


def deployment(spec: dict, replicas: int | None, min_replicas: int, max_replicas: int, num_cpus: float,
               memory_bytes: int):
    """The Ray Serve application: one deployment of goosedump replicas."""
    _, serve = import_ray()
    from ray.serve.config import RequestRouterConfig

    @serve.ingress(lambda: build_replica_app(spec))
    class Goosedump:
        def check_health(self):
            check_health()

    options = dict(name=APP_NAME, ray_actor_options={"num_cpus": num_cpus, "memory": memory_bytes},
                   max_ongoing_requests=max(4, 4 * spec["max_batch"]), health_check_period_s=5,
                   graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S, graceful_shutdown_wait_loop_s=1,
                   request_router_config=RequestRouterConfig(request_router_class=ROUTER))
    if replicas is None:
        # scale on requests in flight per replica: past what one replica decodes together, add one
        options["autoscaling_config"] = {"min_replicas": min_replicas, "max_replicas": max_replicas,
                                         "initial_replicas": min_replicas,
                                         "target_ongoing_requests": spec["max_batch"],
                                         "upscale_delay_s": 5, "downscale_delay_s": 30}
    else:
        options["num_replicas"] = replicas
    return serve.deployment(**options)(Goosedump).bind()


def replica_needs(args: argparse.Namespace, model) -> tuple[float, int]:
    """(CPUs, bytes) one replica declares to Ray: its threads, and its memory
    at its budget and context (dense weights, expert cache, KV cache, scratch)."""
    from ..layout import estimate_memory
    threads = args.threads or os.cpu_count() or 1
    mem = estimate_memory(model.config, model.layout, model.expert_budget, model.n_ctx, model.options.prefill_tokens)
    return float(threads), int(mem.total * 1.1) + (256 << 20)


def parse_replicas(args: argparse.Namespace) -> tuple[int | None, int, int]:
    """(fixed replicas or None for autoscaling, min, max), checked."""
    text = str(args.replicas).strip().lower()
    if text == "auto":
        lo, hi = args.min_replicas, args.max_replicas
        if lo < 1 or hi < lo:
            raise ReplicaError(f"--min-replicas {lo} and --max-replicas {hi}: need 1 <= min <= max")
        return None, lo, hi
    try:
        n = int(text)
    except ValueError:
        raise ReplicaError(f"--replicas takes a number of replicas or auto, got {args.replicas!r}") from None
    if n < 1:
        raise ReplicaError(f"--replicas must be at least 1, got {n}")
    return n, n, n


def serve_replicas(args: argparse.Namespace, model) -> int:
    """Start (or join, with --ray-address) a Ray cluster, deploy the replicas
    and serve until interrupted."""
    ray, serve = import_ray()
    fixed, lo, hi = parse_replicas(args)
    cpus, memory = replica_needs(args, model)
    spec = replica_spec(args, model)
    local = not args.ray_address
    if local:
        total = os.cpu_count() or 1
        if cpus * lo > total:
            raise ReplicaError(f"{lo} replicas of --threads {int(cpus)} need {int(cpus * lo)} CPUs; this machine has "
                             f"{total}: lower --threads (each replica's) or the replicas, or join a cluster with "
                             f"--ray-address")
        ray.init(num_cpus=total, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    else:
        ray.init(address=args.ray_address, logging_level="WARNING", log_to_driver=False)
    model.close()      # each replica loads its own
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(deployment(spec, fixed, lo, hi, cpus, memory), name=APP_NAME, route_prefix="/")
    how = f"{fixed} replicas" if fixed else f"{lo}..{hi} replicas (autoscaling)"
    print(f"goosedump serve: {os.path.basename(model.path)} as {how} of {int(cpus)} threads on Ray Serve, "
          f"http://{args.host}:{args.port}/v1 (X-Session-Id keeps a conversation on its replica)",
          file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    shut_down(ray, serve, local)
    return 0


def shut_down(ray, serve, local: bool) -> None:
    """Serve's graceful shutdown (the replicas finish what they serve, for up
    to serve.shutdown()'s 30 s), but no wait on a cluster that is already
    gone: a terminal's Ctrl-C, or a service manager stopping the whole
    group, signals the local cluster's GCS and raylet with this process, and
    serve.shutdown() then waited its 30 s for a controller it could no
    longer reach (the group took 44 s to stop, now 11: ray.shutdown()
    terminating what is left)."""
    graceful = threading.Thread(target=serve.shutdown, daemon=True)
    graceful.start()
    while graceful.is_alive() and not (local and cluster_gone(ray)):
        graceful.join(0.25)
    ray.shutdown()


def cluster_gone(ray) -> bool:
    """Whether a process of the local cluster this one started (its GCS,
    raylet, ...) has exited."""
    try:
        node = ray._private.worker._global_node
        return node is not None and bool(node.dead_processes())
    except Exception:           # (Ray's node object is its own: if its form changes, wait as before)
        return False
