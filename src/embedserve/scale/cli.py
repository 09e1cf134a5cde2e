"""`embedserve serve-cluster`: the length pools as a Ray Serve application (extra `scale`)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from embedserve.errors import EmbedServeError

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve-cluster",
        help="run pools.yaml's model pools on Ray Serve: autoscaled deployments behind the gateway",
        description=__doc__,
    )
    p.add_argument("--config", required=True, help="pools.yaml whose pools give 'model:' (docs/scale-out.md)")
    p.add_argument("--host", default="127.0.0.1", help="interface of Serve's HTTP proxy (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port of Serve's HTTP proxy (default: 8000)")
    p.add_argument(
        "--address",
        default="local",
        help="'local' (start a Ray on this machine, the default), 'auto' (the running cluster) or ray://HOST:PORT",
    )
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    p.add_argument(
        "--emit",
        choices=["serve-config", "rayservice"],
        default=None,
        help="print the Serve config (serve build style) or a KubeRay RayService as YAML and exit",
    )
    p.add_argument("--image", default="embedserve:cpu", help="container image for --emit rayservice")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_cmd_serve_cluster)


def _cmd_serve_cluster(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        from embedserve.scale.cluster_config import load_cluster_config

        config = load_cluster_config(args.config)
        if args.emit is not None:
            return _emit(config, args)
        _check_keys(config)
        return _run(config, args)
    except ImportError as e:
        print(f"embedserve serve-cluster: {e}: install the extra: pip install -e '.[scale]'", file=sys.stderr)
        return 2
    except EmbedServeError as e:
        print(f"embedserve serve-cluster: error: {e}", file=sys.stderr)
        return 2


def _check_keys(config: Any) -> None:
    """The keys the ingress will read, read here first: a missing variable or a key two tenants
    share is this command's error, not a replica that Serve retries. (On `--address` of a remote
    cluster the ingress reads its own workers' environment: set the variables there too.)"""
    from embedserve.gateway.tenancy.tenants import Tenants
    from embedserve.scale.ingress_app import own_keys

    own_keys(config)
    if config.tenants:
        Tenants(config.tenants)


def _emit(config: Any, args: argparse.Namespace) -> int:
    from embedserve.scale.app import serve_config
    from embedserve.scale.manifests import dump, rayservice

    doc = serve_config(config) if args.emit == "serve-config" else rayservice(config, args.image)
    sys.stdout.write(dump(doc))
    return 0


def _run(config: Any, args: argparse.Namespace) -> int:
    import ray
    from ray import serve

    from embedserve.scale.app import APP_NAME, build_app

    local = args.address == "local"
    if local:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False)
    else:
        ray.init(address=args.address)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(build_app(config), name=APP_NAME, route_prefix="/")
        print(f"embedserve serve-cluster: ready on http://{args.host}:{args.port}/v1", flush=True)
        stop.wait()
    finally:
        if local:
            serve.shutdown()  # type: ignore[no-untyped-call]
        else:
            serve.delete(APP_NAME)
        ray.shutdown()
    return 0
