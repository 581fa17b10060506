"""The shipped real applications against an exhaustive search of their small spaces (issue 44's
first target): does `setup --budget` and then a tuning session end within 5 % of the best
configuration?

    .venv/bin/python benchmarks/bench_apps.py [hpcc|nwchem ...] [--sizes 400,800]
        [--fraction 0.25 | --budget B] [--repeats 1] [--confirm 3] [--json OUT]

For each application (examples/workloads/<name>.toml; default: every one shipped), in one run:

1. **The exhaustive search.** Every configuration of the application's space on this machine
   (`ConfigSpace.for_device`: only the feasible ones, the constraints kept) at each size,
   measured for real by the product's runner on the path `hpc-ds1 setup` takes
   (`setup.plan_jobs`, then `setup.interleave.measure_interleaved` with `run_jobs`: interleaved
   rounds in a seeded order, one launch per ranks value, under the device lock) with
   `--repeats` timed runs each. The best per size is the fastest configuration that ran ok.
2. **`hpc-ds1 setup --budget B`** into a fresh home (the workload file and its inputs copied into
   its workloads/ folder, its own embedded servers), at the same sizes and repeats, and its
   model trained. B defaults to a quarter of the whole space (`--fraction 0.25`, at least 2 runs
   a size: setup's least per cell): the issue's "measure only part of the space", inside its
   15-30 %; on these 12-16-configuration spaces a quarter is 3-4 runs a size, the fewest that
   leave active learning a run to choose after its space-filling start.
3. **A tuning session per size**: `hpc-ds1 tune --json` on that home from the workload's default
   start (one rank, the fewest threads, every knob at its declared default; where the
   constraints refuse that, the space's default), each move that needs an engineer approved
   at the terminal's prompt (`y`, fed on standard input). The session ends on its best
   configuration (the finished event's `best_config`).
4. **The comparison, under the noise.** Both ends are measured numbers on a shared machine, so the
   session's end and the exhaustive best are measured again, alternately (`--confirm` pairs, the
   order within a pair alternating), by the same runner. Reported per size: both medians, each
   one's spread (the runs' range over their median), the ratio of the medians (session / best),
   the median of the pairs' ratios, and the verdict `within 5 %` on the ratio of the medians,
   with `clear` when every pair's ratio falls on the same side of 1.05 (else the noise can move
   the verdict). Where the session ends on the exhaustive best itself the ratio is 1 and nothing
   is measured again. Beside the verdict: the end's runtime over the best's in the exhaustive
   search's own runs, and its rank there (one draw of the noise each).

Printed as it goes; `--json` writes the report (the command, the machine's load before and
after, and every run's figures). Nothing here is a timing target for CI: its small version
(tests/benchmarks/test_bench_apps.py) checks the report's structure and invariants only."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hpc_ds1.machine.devicelock import device_lock
from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.runner import Job, RunResult, run_many
from hpc_ds1.runner.checks import InvalidJob, validate
from hpc_ds1.setup import PROFILES, plan_jobs
from hpc_ds1.setup.interleave import chunk_rng, measure_interleaved, run_jobs
from hpc_ds1.space import Config, ConfigSpace
from hpc_ds1.workloads import CommandWorkload
from hpc_ds1.workloads.registry import load_file

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "workloads"
APPS = ("hpcc", "nwchem")  # the shipped real applications (issue 44, item 1)
HPC_DS1 = str(Path(sys.executable).with_name("hpc-ds1"))
TARGET = 1.05  # within 5 % of the exhaustive best
CLI_TIMEOUT_S = 3 * 3600


def uptime() -> str:
    """The machine's load as `uptime` prints it."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def words(config: Config) -> str:
    own = " ".join(f"{k}={v}" for k, v in config.knobs)
    return f"ranks={config.ranks} threads={config.threads} {own}".strip()


def spread(times: list[float]) -> float:
    """The runs' range over their median (0 for one run)."""
    if len(times) < 2:
        return 0.0
    return (max(times) - min(times)) / statistics.median(times)


def make_home(root: Path, app: str) -> Path:
    """A fresh home with the application's workload file and its input folder."""
    home = root / f"home-{app}"
    folder = home / "workloads"
    folder.mkdir(parents=True)
    shutil.copy(EXAMPLES / f"{app}.toml", folder / f"{app}.toml")
    if (EXAMPLES / app).is_dir():
        shutil.copytree(EXAMPLES / app, folder / app)
    return home


def cli(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`hpc-ds1 ARGS` on `home` with its own embedded servers (no HPC_DS1_* of this process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env["HPC_DS1_HOME"] = str(home)
    done = subprocess.run(
        [HPC_DS1, *args], env=env, input=stdin, capture_output=True, text=True,
        timeout=CLI_TIMEOUT_S,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"hpc-ds1 {' '.join(args)}: {done.stdout}{done.stderr}")
    return done


def default_start(workload: CommandWorkload, space: ConfigSpace) -> Config:
    """One rank, the fewest threads, every knob at its declared default, where the space holds
    it; else the space's own default."""
    wanted = Config(
        ranks=1,
        threads=min(space.threads),
        tile=space.default().tile,
        block=space.default_block,
        knobs={k.name: k.default for k in workload.knobs},
    )
    return wanted if wanted in set(space.configs()) else space.default()


def measure_pairs(
    app: str, size: int, best: Config, end: Config, pairs: int, lock: Path
) -> tuple[dict[str, list[float]], list[str]]:
    """`pairs` runs of each configuration, alternately (best first in even pairs, the session's
    end first in odd ones), one timed run each, by the runner setup uses."""
    out: dict[str, list[float]] = {"best": [], "end": []}
    failed = []
    for i in range(pairs):
        order = [("best", best), ("end", end)] if i % 2 == 0 else [("end", end), ("best", best)]
        for label, config in order:
            with device_lock(lock):
                (result,) = run_many([Job(workload=app, size=size, config=config, repeats=1)])
            if result.ok and result.runtime_s is not None:
                out[label].append(result.runtime_s)
            else:
                failed.append(f"{label}: {result.status.value} {result.error}"[:300])
    return out, failed


def exhaustive(
    workload: CommandWorkload, space: ConfigSpace, sizes: list[int], repeats: int, lock: Path
) -> dict[str, Any]:
    """Every configuration at every size, measured as setup measures a chunk."""
    app = workload.name
    chunks = plan_jobs([workload], {app: space}, PROFILES["full"], sizes, repeats)
    out: dict[str, Any] = {}
    for chunk in chunks:
        size = chunk[0].size
        started = time.monotonic()
        rng = chunk_rng(0, "bench-apps", app, size)
        with device_lock(lock):
            results = measure_interleaved(chunk, rng, run_jobs(None))
        seconds = time.monotonic() - started
        rows = [row(job.config, result) for job, result in zip(chunk, results, strict=True)]
        ok = [r for r in rows if r["status"] == "ok"]
        best = min(ok, key=lambda r: r["runtime_s"]) if ok else None
        out[str(size)] = {
            "configs": rows,
            "runs": sum(r["repeats"] for r in rows),
            "seconds": round(seconds, 1),
            "best": best,
        }
        shown = f"{best['words']} {best['runtime_s']:.4g} s" if best else "none ran ok"
        print(
            f"{app} {size}: exhaustive {len(rows)} configurations, "
            f"{out[str(size)]['runs']} runs in {seconds:.0f} s: best {shown}",
            flush=True,
        )
    return out


def row(config: Config, result: RunResult) -> dict[str, Any]:
    return {
        "config": config.model_dump(),
        "words": words(config),
        "status": result.status.value,
        "runtime_s": result.runtime_s if result.ok else None,
        "runtimes_s": list(result.runtimes_s),
        "repeats": max(1, result.repeats),
    }


def in_exhaustive(search: dict[str, Any], end: Config) -> dict[str, Any]:
    """Where the session's end stood in the exhaustive search's own runs: its runtime over the
    best's there, and its rank among the configurations that ran ok (1: the best). Figures
    beside the verdict, not it: each of one search's runs is one draw of the machine's noise."""
    ok = sorted(r["runtime_s"] for r in search["configs"] if r["status"] == "ok")
    mine = next((r for r in search["configs"] if Config.model_validate(r["config"]) == end), None)
    if mine is None or mine["runtime_s"] is None or not ok:
        return {"exhaustive_ratio": None, "exhaustive_rank": None, "exhaustive_ok": len(ok)}
    return {
        "exhaustive_ratio": mine["runtime_s"] / ok[0],
        "exhaustive_rank": ok.index(mine["runtime_s"]) + 1,
        "exhaustive_ok": len(ok),
    }


def compare(
    app: str, size: int, best: Config, end: Config, pairs: int, lock: Path
) -> dict[str, Any]:
    """The session's end against the exhaustive best, both measured again alternately."""
    if end == best:
        return {"same_config": True, "ratio": 1.0, "within_5pct": True, "clear": True}
    runs, failed = measure_pairs(app, size, best, end, pairs, lock)
    b, e = runs["best"], runs["end"]
    found: dict[str, Any] = {"same_config": False, "best_runtimes_s": b, "end_runtimes_s": e}
    found["failed"] = failed
    if not b or not e:
        found.update(ratio=None, within_5pct=False, clear=False)
        return found
    ratio = statistics.median(e) / statistics.median(b)
    pair_ratios = [x / y for x, y in zip(e, b, strict=False)]
    sides = {r <= TARGET for r in pair_ratios}
    found.update(
        best_median_s=statistics.median(b),
        end_median_s=statistics.median(e),
        best_spread=spread(b),
        end_spread=spread(e),
        ratio=ratio,
        pair_ratios=pair_ratios,
        median_pair_ratio=statistics.median(pair_ratios) if pair_ratios else None,
        within_5pct=ratio <= TARGET,
        clear=len(sides) == 1 and (ratio <= TARGET) in sides,
    )
    return found


def bench_app(app: str, root: Path, args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Fills `report` as it goes: what ran stays in it if a later step fails."""
    home = make_home(root, app)
    workload = load_file(home / "workloads" / f"{app}.toml")
    assert isinstance(workload, CommandWorkload)
    space = ConfigSpace.for_device(fingerprint(), workload)
    configs = space.configs()
    sizes = sizes_for(app, args.sizes) or list(workload.sizes)
    whole = len(configs) * len(sizes)
    budget = args.budget or max(2 * len(sizes), round(args.fraction * whole))
    lock = home  # the device lock setup takes (one per home)
    report.update(
        {
            "workload_file": str(EXAMPLES / f"{app}.toml"),
            "sizes": sizes,
            "space_per_size": len(configs),
            "space": whole,
            "budget": budget,
            "budget_fraction": budget / whole,
            "repeats": args.repeats,
            "confirm_pairs": args.confirm,
            "feasible": all(_feasible(app, s, c, space) for s in sizes for c in configs),
        }
    )
    print(
        f"{app}: {len(configs)} configurations x {len(sizes)} sizes {sizes} = {whole}; "
        f"budget {budget} ({budget / whole:.0%}); {args.repeats} timed run(s) each",
        flush=True,
    )
    started = time.monotonic()
    report["exhaustive"] = exhaustive(workload, space, sizes, args.repeats, lock)
    report["exhaustive_seconds"] = round(time.monotonic() - started, 1)

    started = time.monotonic()
    setup = json.loads(
        cli(home, "setup", "--workload", app, "--sizes", ",".join(map(str, sizes)),
            "--budget", str(budget), "--repeats", str(args.repeats), "--json").stdout
    )  # fmt: skip
    report["setup"] = {
        "measured": setup["measured"],
        "by_status": setup["by_status"],
        "seconds": round(time.monotonic() - started, 1),
        "model": (setup.get("model") or {}).get("version"),
    }
    print(f"{app}: setup --budget {budget}: {json.dumps(report['setup'])}", flush=True)

    start = default_start(workload, space)
    start_words = ",".join(
        [f"ranks={start.ranks}", f"threads={start.threads}"] + [f"{k}={v}" for k, v in start.knobs]
    )
    report["start"] = start.model_dump()
    report["sessions"], report["comparison"] = {}, {}
    for size in sizes:
        started = time.monotonic()
        tuned = cli(
            home, "tune", "--workload", app, "--size", str(size), "--start", start_words,
            "--json", stdin="y\n\n" * 200,
        )  # fmt: skip
        body = json.loads(tuned.stdout[tuned.stdout.index("{") :])
        finished = body["finished"] or {}
        steps = [e["data"] for e in body["events"] if e["type"] == "step_run"]
        end = (
            Config.model_validate(finished["best_config"]) if finished.get("best_config") else None
        )
        session = {
            "reason": finished.get("reason"),
            "real_runs": finished.get("real_runs", len(steps)),
            "steps": [
                {"config": s["config"], "status": s["status"], "runtime_s": s.get("runtime_s")}
                for s in steps
            ],
            "end": end.model_dump() if end else None,
            "end_words": words(end) if end else None,
            "end_runtime_s": finished.get("best_runtime_s"),
            "approvals": tuned.stderr.count("approve? [y/n]"),
            "seconds": round(time.monotonic() - started, 1),
        }
        report["sessions"][str(size)] = session
        best_row = report["exhaustive"][str(size)]["best"]
        if end is None or best_row is None:
            report["comparison"][str(size)] = {"ratio": None, "within_5pct": False}
            print(f"{app} {size}: session ended {session['reason']} without a configuration")
            continue
        best = Config.model_validate(best_row["config"])
        found = compare(app, size, best, end, args.confirm, lock)
        found.update(in_exhaustive(report["exhaustive"][str(size)], end))
        report["comparison"][str(size)] = found
        ratio = f"{found['ratio']:.3f}" if found.get("ratio") is not None else "-"
        noise = (
            f"; medians best {found['best_median_s']:.4g} s (spread {found['best_spread']:.1%}), "
            f"end {found['end_median_s']:.4g} s (spread {found['end_spread']:.1%}), "
            f"pair ratios {', '.join(f'{r:.3f}' for r in found['pair_ratios'])}"
            if "best_median_s" in found
            else ""
        )
        print(
            f"{app} {size}: session ({session['reason']}, {session['real_runs']} runs, "
            f"{session['approvals']} approvals) ended on {session['end_words']}; exhaustive "
            f"best {best_row['words']}; ratio {ratio}: "
            f"{'within' if found['within_5pct'] else 'NOT within'} 5 %"
            f"{'' if found.get('clear') else ' (not clear under the noise)'}{noise}",
            flush=True,
        )
    report["all_within_5pct"] = all(c.get("within_5pct") for c in report["comparison"].values())


def sizes_for(app: str, given: list[str]) -> list[int]:
    """The sizes `--sizes` gives this application (APP=N,N before plain N,N); [] if none."""
    plain, own = [], []
    for text in given:
        name, _, numbers = text.rpartition("=")
        values = [int(x) for x in numbers.split(",") if x.strip()]
        if name == app:
            own = values
        elif not name:
            plain = values
    return own or plain


def _feasible(app: str, size: int, config: Config, space: ConfigSpace) -> bool:
    try:
        validate(app, size, config, space)
    except InvalidJob:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("apps", nargs="*", help=f"of {', '.join(APPS)} (default: every one)")
    parser.add_argument(
        "--sizes",
        action="append",
        default=[],
        metavar="[APP=]N,N",
        help="sizes to measure (repeatable: APP=N,N for one application); default: the file's",
    )
    parser.add_argument("--fraction", type=float, default=0.25)
    parser.add_argument("--budget", type=int, help="runs in all (default: --fraction x space)")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs a configuration")
    parser.add_argument("--confirm", type=int, default=3, help="alternate pairs to compare")
    parser.add_argument("--keep", action="store_true", help="keep the homes (printed)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    apps = args.apps or list(APPS)
    unknown = [a for a in apps if a not in APPS]
    if unknown:
        parser.error(f"unknown application(s) {unknown}: the shipped ones are {list(APPS)}")
    fp = fingerprint()
    out: dict[str, Any] = {
        "command": " ".join(
            ["benchmarks/bench_apps.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "machine": {
            "host": socket.gethostname(),
            "cpu_model": fp.cpu_model,
            "usable_cpus": fp.usable_cpus,
            "uptime_before": uptime(),
        },
        "target_ratio": TARGET,
        "apps": {},
    }
    print(f"{out['machine']['uptime_before']} · {fp.cpu_model} · {fp.usable_cpus} CPUs", flush=True)
    root = Path(tempfile.mkdtemp(prefix="hpc-ds1-bench-apps-"))
    started = time.monotonic()
    try:
        for app in apps:
            report: dict[str, Any] = {"comparison": {}}
            out["apps"][app] = report
            try:
                bench_app(app, root, args, report)
            except (RuntimeError, subprocess.TimeoutExpired, KeyError, ValueError) as error:
                # the other applications still run; the report says what stopped this one
                print(f"{app}: stopped: {error}", flush=True)
                report.update(error=str(error)[-2000:], all_within_5pct=False)
    finally:
        out["machine"]["uptime_after"] = uptime()
        out["seconds"] = round(time.monotonic() - started, 1)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
        if args.keep:
            print(f"homes kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{out['machine']['uptime_after']} · {out['seconds']:.0f} s in all", flush=True)
    for app, found in out["apps"].items():
        verdicts = {
            size: ("-" if c.get("ratio") is None else f"{c['ratio']:.3f}")
            for size, c in found["comparison"].items()
        }
        held = "every size within 5 %" if found["all_within_5pct"] else "NOT every size within 5 %"
        print(f"{app}: session end / exhaustive best per size {verdicts}: {held}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
