"""Load test of `jaxmnist serve`: 2,000 predictions from 16 concurrent clients, on loopback.

Starts `jaxmnist serve RUN_DIR --port 0` as its own process (a free port on
127.0.0.1), waits for its address, sends `--warmup` untimed requests, then
`--requests` timed POST /api/predict requests from `--clients` threads, each
with one keep-alive connection. Every request body is the PNG a person's drawing
makes on the page (a 280x280 canvas), so each request decodes, preprocesses and
predicts. The test is bounded: a fixed number of requests, a per-request
timeout and an overall deadline; the server is stopped at the end whatever
happens. Clients and server share this machine's cores, and the figures say
what the machine's load was.

Usage: python benchmarks/serve_load.py RUN_DIR
Prints throughput, p50/p99 latency and errors; writes JSON (`--out`, default
benchmarks/results/serve_load/). Target for the MLP: 0 errors, p99 < 50 ms.
`python benchmarks/serve_load.py --smoke` trains `tpu101`'s MLP for a few steps on random
images in this process, then sends 20 requests from 2 clients to its server. Needs the
`serve` extra.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from importlib import util
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from jaxmnist import runtime

from benchlib.results import SMOKE_HELP, default_out, provenance

TARGET_P99_MS = 50.0


def drawn_digit_png() -> bytes:
    """The page's canvas after someone drew a 7: black strokes on white, 280x280."""
    image = Image.new("RGB", (280, 280), "white")
    ImageDraw.Draw(image).line(
        [(70, 56), (210, 56), (168, 140), (126, 238)], fill="black", width=20, joint="curve"
    )
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def start_server(run_dir: str, timeout: float) -> tuple[subprocess.Popen, str, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxmnist", "serve", run_dir, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if match := re.search(r"http://127\.0\.0\.1:(\d+)/", line):
            return proc, "127.0.0.1", int(match.group(1))
    proc.kill()
    code = proc.wait()
    proc.stdout.close()
    raise SystemExit(f"the server did not start (exit code {code})")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_clients(host, port, body, total, clients, timeout, deadline):
    """Sends `total` requests from `clients` threads; returns (latencies_s, errors)."""
    lock = threading.Lock()
    left = [total]
    latencies, errors = [], []

    def client():
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            while time.monotonic() < deadline:
                with lock:
                    if left[0] == 0:
                        return
                    left[0] -= 1
                start = time.perf_counter()
                try:
                    conn.request(
                        "POST", "/api/predict", body=body, headers={"Content-Type": "image/png"}
                    )
                    reply = conn.getresponse()
                    data = reply.read()
                    ok = reply.status == 200 and b'"probabilities"' in data
                    problem = None if ok else f"HTTP {reply.status}"
                except (OSError, http.client.HTTPException) as e:
                    problem = f"{type(e).__name__}: {e}"
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=timeout)
                elapsed = time.perf_counter() - start
                with lock:
                    (errors.append(problem) if problem else latencies.append(elapsed))
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors


def tiny_run(run_dir: Path) -> None:
    """A finished `tpu101` run in `run_dir`, a few steps on random images, whose config
    names MNIST: any `jaxmnist serve` loads its model."""
    from jaxmnist import config as config_lib
    from jaxmnist.bench.measure import synthetic_dataset
    from jaxmnist.train import train_and_evaluate

    cfg = config_lib.get_preset("tpu101")
    train = dataclasses.replace(cfg.train, batch_size=16, steps=4, eval_batch_size=32)
    cfg = dataclasses.replace(cfg, compile_cache=False, train=train)
    dataset = synthetic_dataset("mnist", train_size=64, test_size=32)
    train_and_evaluate(cfg, run_dir, dataset=dataset)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help="(none with --smoke)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds for the test")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument("--out", help="default: a new record in results/serve_load/")
    args = parser.parse_args(argv)
    if (args.run_dir is None) != args.smoke:
        parser.error("give RUN_DIR, or --smoke alone")
    missing = [m for m in ("starlette", "uvicorn") if util.find_spec(m) is None]
    if missing:
        sys.exit(f"serve_load.py: needs the serve extra ({', '.join(missing)} missing): "
                 "pip install -e '.[serve]'")  # fmt: skip
    out = Path(args.out) if args.out else default_out("serve_load.json", args.smoke)
    if args.smoke:
        with tempfile.TemporaryDirectory() as tmp:
            args.run_dir = str(Path(tmp) / "run")
            args.requests, args.clients, args.warmup = 20, 2, 2
            tiny_run(Path(args.run_dir))
            load_test(args, out)
    else:
        load_test(args, out)


def load_test(args: argparse.Namespace, out: Path) -> None:
    """The load test of `args.run_dir`'s server, its figures written to `out`."""
    body = drawn_digit_png()
    load_before = os.getloadavg()
    proc, host, port = start_server(args.run_dir, timeout=120)
    try:
        conn = http.client.HTTPConnection(host, port, timeout=args.timeout)
        conn.request("GET", "/api/model")
        model = json.loads(conn.getresponse().read())
        conn.close()
        deadline = time.monotonic() + args.deadline
        run_clients(host, port, body, args.warmup, args.clients, args.timeout, deadline)
        start, server_cpu, client_cpu = (
            time.perf_counter(),
            cpu_seconds(proc.pid),
            time.process_time(),
        )
        latencies, errors = run_clients(
            host, port, body, args.requests, args.clients, args.timeout, deadline
        )
        wall = time.perf_counter() - start
        server_cpu = cpu_seconds(proc.pid) - server_cpu
        client_cpu = time.process_time() - client_cpu
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    ms = np.asarray(latencies) * 1e3
    env = runtime.environment()
    result = {
        "requests": args.requests,
        "completed": len(latencies),
        "errors": len(errors),
        "error_kinds": sorted(set(errors))[:10],
        "clients": args.clients,
        "wall_seconds": wall,
        "requests_per_second": len(latencies) / wall,
        "latency_ms": {
            "p50": float(np.percentile(ms, 50)) if len(ms) else None,
            "p90": float(np.percentile(ms, 90)) if len(ms) else None,
            "p99": float(np.percentile(ms, 99)) if len(ms) else None,
            "max": float(ms.max()) if len(ms) else None,
        },
        "server_cpu_ms_per_request": 1e3 * server_cpu / max(1, len(latencies)),
        "client_cpu_ms_per_request": 1e3 * client_cpu / max(1, len(latencies)),
        "target": {"errors": 0, "p99_ms": TARGET_P99_MS},
        "model": {k: model.get(k) for k in ("model", "model_config", "num_params", "dataset")},
        "body": "280x280 PNG of a drawn 7 (decode, MNIST preprocessing, MLP forward)",
        "cpu_model": env.get("cpu_model"),
        "cpu_count": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "jax": env.get("jax"),
        "run_dir": args.run_dir,
        "command": " ".join(["python", "benchmarks/serve_load.py", *sys.argv[1:]]),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "provenance": provenance()}, indent=2) + "\n")
    lat = result["latency_ms"]
    print(f"cpu          {result['cpu_model']} ({result['cpu_count']} cores)")
    print(f"load average {load_before[0]:.1f} before, {result['load_average_after'][0]:.1f} after")
    print(f"requests     {len(latencies)} ok, {len(errors)} errors, {args.clients} clients")
    print(f"throughput   {result['requests_per_second']:.0f} requests/s ({wall:.2f} s)")
    if len(ms):
        print(
            f"latency      p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms, "
            f"max {lat['max']:.1f} ms"
        )
    print(
        f"cpu time     server {result['server_cpu_ms_per_request']:.2f} ms, clients "
        f"{result['client_cpu_ms_per_request']:.2f} ms per request"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
