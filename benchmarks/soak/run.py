"""Overload soak: a mixed-length load (16 to 16K tokens, online and batch) at about twice what the
server can do, for a set time, then idle; through one `embedserve serve`, or through `embedserve
gateway` over two pools with one pool killed (SIGKILL) and restarted mid-run. Loopback only.

    PYTHONPATH=src:. python benchmarks/soak/run.py --duration 180 --through server --out DIR

Phases: calibrate (closed loop, 4 clients: answered tokens/s -> capacity in requests/s of the
mix) -> load (open loop, Poisson arrivals at --overload x capacity for --duration s) -> drain
(every request answered) -> after (closed loop, 1 client, --after s: latency once the load is
gone) -> idle 5 s -> queue gauges read from /metrics. Each server process's RSS and open fds are
read every second. A sample of answered vectors is re-embedded in-process afterwards (same
model, fp32, one input at a time) and compared by cosine. Writes DIR/report.md and report.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository root holds benchmarks/ and tests/
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.soak.load import Recorder, closed_loop, mean_tokens, monitor, open_loop, queue_gauges  # noqa: E402
from benchmarks.soak.report import ProcSample, as_json, markdown, summarize  # noqa: E402
from tests.helpers.gateway_process import start_gateway, write_config  # noqa: E402
from tests.helpers.server_process import ServerProcess, free_port  # noqa: E402

SERVER_ARGS = ("--request-timeout", "60", "--warmup-lengths", "16,512")
SHORT_MAX, LONG_MAX = 4096, 16384
CLIENT_EXPIRY_S = 5.0
ROUTES = [{"class": "online", "order": ["short", "long"]}, {"class": "batch", "order": ["long", "short"]}]


def tiny_model(path: Path) -> Path:
    """The tiny random-weight Qwen3 (hidden 64, 2 layers) the tests use, built once."""
    if not (path / "config.json").exists():
        from tests.helpers.tiny_models import build_decoder

        build_decoder(path)
    return path


def spawn_server(model: Path, log_dir: Path, port: int, max_len: int, extra: list[str]) -> ServerProcess:
    log_path = log_dir / f"server-{port}-{int(time.time())}.log"
    cmd = [sys.executable, "-m", "embedserve", "serve", "--model", str(model), "--port", str(port),
           "--max-model-len", str(max_len), *SERVER_ARGS, *extra]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    return ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)


class Cluster:
    """The processes under test: name -> ServerProcess; `front` is where clients send."""

    def __init__(
        self, model: Path, out: Path, through: str, keep_alive: float | None, gateway_timeout: float | None
    ) -> None:
        self.model, self.out = model, out
        # --timeout-keep-alive of every process (None: their default)
        self.extra = [] if keep_alive is None else ["--timeout-keep-alive", f"{keep_alive:g}"]
        self.events: list[str] = []
        self.servers: dict[str, ServerProcess] = {}
        if through == "server":
            self.servers["server"] = spawn_server(model, out, free_port(), LONG_MAX, self.extra)
        else:
            self.servers["pool-short"] = spawn_server(model, out, free_port(), SHORT_MAX, self.extra)
            self.servers["pool-long"] = spawn_server(model, out, free_port(), LONG_MAX, self.extra)
        for s in self.servers.values():
            s.wait_ready(180)
        self.gateway: ServerProcess | None = None
        if through == "gateway":
            pools = {
                "short": {"max_tokens": SHORT_MAX, "upstreams": [self.servers["pool-short"].base_url]},
                "long": {"max_tokens": LONG_MAX, "upstreams": [self.servers["pool-long"].base_url]},
            }
            cfg = write_config(out / "pools.yaml", model, pools, ROUTES, health_interval_s=0.5)
            deadline = [] if gateway_timeout is None else ["--request-timeout", f"{gateway_timeout:g}"]
            self.gateway = start_gateway(cfg, out, *self.extra, *deadline)
            self.gateway.wait_ready(120)
        self.front = (self.gateway or self.servers["server"]).base_url

    def pids(self) -> dict[str, int]:
        procs = {**self.servers, **({"gateway": self.gateway} if self.gateway else {})}
        return {name: s.proc.pid for name, s in procs.items() if s.proc.poll() is None}

    def kill(self, name: str, at: float) -> None:
        self.servers[name].proc.send_signal(signal.SIGKILL)
        self.servers[name].proc.wait(30)
        self.events.append(f"{at:.0f} s: SIGKILL {name}")

    def restart(self, name: str, at: float) -> None:
        old = self.servers.pop(name)
        port = int(old.base_url.rsplit(":", 1)[1])
        limit = LONG_MAX if name.endswith("long") else SHORT_MAX
        new = spawn_server(self.model, self.out, port, limit, self.extra)
        self.servers[name + " (restarted)"] = new
        self.events.append(f"{at:.0f} s: restarting {name} on the same port")
        new.wait_ready(180)

    def stop(self) -> dict[str, int]:
        procs = [*self.servers.items(), *([("gateway", self.gateway)] if self.gateway else [])]
        return {name: s.terminate(90) for name, s in procs}


async def drive(cluster: Cluster, args: argparse.Namespace, readings: list[ProcSample]) -> dict[str, Any]:
    rec = Recorder(time.monotonic())
    stop = asyncio.Event()
    mon = asyncio.create_task(monitor(rec, cluster.pids, readings, stop))
    # The client retires an idle connection after httpx's usual 5 s, below the servers' and the
    # gateway's keep-alive (api/keepalive.py), so it never sends on one they are closing.
    limits = httpx.Limits(
        max_connections=2000, max_keepalive_connections=64, keepalive_expiry=CLIENT_EXPIRY_S
    )
    timeout = httpx.Timeout(args.client_timeout, pool=args.client_timeout)
    async with httpx.AsyncClient(base_url=cluster.front, limits=limits, timeout=timeout) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        await closed_loop(client, rec, 4, args.calibrate, args.seed + 1, model, "calibrate")
        ok = [s for s in rec.samples if s.status == 200]
        capacity_tok_s = sum(s.tokens for s in ok) / args.calibrate
        rate = args.overload * capacity_tok_s / mean_tokens()
        load_start = rec.now()
        tasks: list[asyncio.Task[None]] = []
        plan = ["kill", "restart"] if args.through == "gateway" else []

        def tick(t: float) -> None:  # gateway mode: kill the long pool at 40 %, restart it at 55 %
            if plan[:1] == ["kill"] and t >= 0.40 * args.duration:
                cluster.kill("pool-long", rec.now())
                plan.pop(0)
            elif plan[:1] == ["restart"] and t >= 0.55 * args.duration:
                tasks.append(asyncio.create_task(asyncio.to_thread(cluster.restart, "pool-long", rec.now())))
                plan.pop(0)

        await open_loop(client, rec, rate, args.duration, args.seed, model, tick)
        await asyncio.gather(*tasks)
        drained = rec.now()
        await asyncio.sleep(5)
        await closed_loop(client, rec, 1, args.after, args.seed + 2, model, "after")
    await asyncio.sleep(5)
    queues = {n: queue_gauges(s.base_url) for n, s in cluster.servers.items()}
    stop.set()
    await mon
    return {
        "rec": rec, "queues": queues, "warm_until": load_start + 0.2 * args.duration,
        "capacity_tok_s": capacity_tok_s, "rate": rate, "load_start": load_start, "drained": drained,
    }  # fmt: skip


def reference_cosines(model: Path, rec: Recorder) -> list[float]:
    from embedserve import Engine

    with Engine.from_pretrained(model) as engine:
        out = []
        for job, served in rec.vectors:
            ref = engine.embed([job.text])[0]
            out.append(float(np.dot(ref, served) / (np.linalg.norm(ref) * np.linalg.norm(served))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=180, help="seconds of overload")
    ap.add_argument("--through", choices=["server", "gateway"], default="server")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--overload", type=float, default=2.0, help="offered load / calibrated capacity")
    ap.add_argument("--calibrate", type=float, default=20, help="seconds of closed-loop calibration")
    ap.add_argument("--after", type=float, default=30, help="seconds of single-client load after")
    ap.add_argument("--client-timeout", type=float, default=180)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", type=Path, default=Path("/tmp/embedserve-soak-model"))
    ap.add_argument(
        "--keep-alive",
        type=float,
        default=None,
        help="--timeout-keep-alive of the servers and the gateway (default: theirs; 5 = before #27's fix, "
        f"equal to the client's {CLIENT_EXPIRY_S:g} s keep-alive expiry)",
    )
    ap.add_argument(
        "--gateway-timeout",
        type=float,
        default=None,
        help="the gateway's --request-timeout (end-to-end deadline; default: its own); below the "
        f"pools' {SERVER_ARGS[1]} s it is the gateway that answers 504 deadline_exceeded",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = tiny_model(args.model)
    readings: list[ProcSample] = []
    cluster = Cluster(model, args.out, args.through, args.keep_alive, args.gateway_timeout)
    try:
        run = asyncio.run(drive(cluster, args, readings))
    finally:
        exits = cluster.stop()
    rec: Recorder = run["rec"]
    cosines = reference_cosines(model, rec)
    load_end = run["load_start"] + args.duration
    summary = summarize(rec.samples, readings, run["warm_until"], cosines, run["queues"], load_end)
    mean = mean_tokens()
    meta = {
        "through": args.through,
        "command": "python benchmarks/soak/run.py " + " ".join(sys.argv[1:]),
        "model": "tiny random-weight Qwen3 (hidden 64, 2 layers, fp32), tests.helpers.tiny_models",
        "calibrated capacity": f"{run['capacity_tok_s']:,.0f} tokens/s = {run['capacity_tok_s'] / mean:.2f} "
        f"requests/s of the mix (mean {mean:,.0f} tokens)",
        "offered": f"{run['rate']:.2f} requests/s ({args.overload}x) for {args.duration:.0f} s from "
        f"{run['load_start']:.0f} s; all answered by {run['drained']:.0f} s",
        "events": "; ".join(cluster.events) or "none",
        "keep-alive": f"{args.keep_alive:g} s" if args.keep_alive else "the servers' default",
        "gateway deadline": f"{args.gateway_timeout:g} s" if args.gateway_timeout else "its default",
        "exit codes (SIGTERM at the end)": exits,
        "warm-up ends": f"{run['warm_until']:.0f} s (20 % into the load)",
    }
    raw = {
        "samples": [asdict(x) for x in rec.samples],
        "readings": [asdict(x) for x in readings],
        "cosines": cosines,
    }
    (args.out / "samples.json").write_text(json.dumps(raw))
    (args.out / "report.json").write_text(json.dumps(as_json(summary, meta), indent=2, default=str))
    (args.out / "report.md").write_text(markdown(summary, meta))
    print(markdown(summary, meta))
    sys.exit(0 if all(summary.checks.values()) else 1)


if __name__ == "__main__":
    main()
