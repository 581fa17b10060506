"""What TLS itself costs per request, without the services behind the gateway: a trivial ASGI app
under uvicorn with uvloop (as the gateway runs), served plain, through the gateway's one-port
protocol (hpc_ds1.infra.tls: plain on loopback, TLS on every other address), and through
uvicorn's own `ssl_certfile`, each measured with wrk on this machine's own non-loopback
address, alternating for `--rounds` rounds. Run: `python benchmarks/bench_tls_overhead.py`.

It says whether the split costs anything over uvicorn's own TLS, and what a TLS round trip adds
here (server and wrk on the same CPUs)."""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hpc_ds1.infra import tls
from hpc_ds1.infra.ports import free_port, wait_for_port
from hpc_ds1.security.credentials import reachable_host

SERVER = r"""
import sys, uvicorn
from types import SimpleNamespace
from hpc_ds1.infra import tls

BODY = b'{"decision_id":"d","action":"STOP","confidence":0.9}' * 6

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": BODY})

port, mode, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
if mode == "split":
    extra = tls.uvicorn_options(SimpleNamespace(tls_cert=cert, tls_key=key, tls="auto"))
elif mode == "native":
    extra = {"ssl_certfile": cert, "ssl_keyfile": key}
else:
    extra = {}
uvicorn.run(app, host="0.0.0.0", port=port, log_level="warning", loop="uvloop",
            access_log=False, **extra)
"""
MODES = ("plain", "split", "native")


def measure(
    mode: str, host: str, cert: Path, key: Path, connections: int, seconds: float
) -> tuple[float, str]:
    """(requests/s, p50 as wrk prints it) of one server of `mode`."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port), mode, str(cert), str(key)],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_port("127.0.0.1", port, 30)
        url = f"{'http' if mode == 'plain' else 'https'}://{host}:{port}/"
        command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", url]
        out = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 30).stdout
        rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
        p50 = re.search(r"^\s*50%\s+(\S+)", out, re.M)
        if rps is None or p50 is None:
            raise SystemExit(f"wrk printed no figures for {mode}:\n{out}")
        return float(rps.group(1)), p50.group(1)
    finally:
        server.terminate()
        server.wait(15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (deploy/install-wrk.sh)")
    host = reachable_host("0.0.0.0")
    if host.startswith("127.") or not host[0].isdigit():
        raise SystemExit(f"no non-loopback address to measure on (found {host})")
    home = Path(tempfile.mkdtemp(prefix="hpcds1-bench-tls-"))
    paths, _ = tls.ensure_server_cert(home, [host])
    found: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            rps, p50 = measure(mode, host, paths.cert, paths.key, args.connections, args.seconds)
            found[mode].append(rps)
            print(f"  {mode:6} {rps:9.0f} requests/s  p50 {p50}", flush=True)
    median = {m: statistics.median(v) for m, v in found.items()}
    print(
        f"wrk, {args.connections} connections, {args.seconds:g} s, {args.rounds} rounds, to "
        f"{host}: median requests/s plain {median['plain']:.0f}, gateway TLS (split) "
        f"{median['split']:.0f} ({100 * median['split'] / median['plain']:.0f} % of plain), "
        f"uvicorn's own TLS {median['native']:.0f}; TLS adds "
        f"{1000 * args.connections * (1 / median['split'] - 1 / median['plain']):.2f} ms per "
        "request at this concurrency"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
