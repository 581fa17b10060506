"""`hpc-ds1 evaluate [--quick]`: measure the held-out sizes for real, replay every policy on
that landscape, and publish how good this machine's model is. `--freeze` writes a test set
before any of it is measured; `--final` measures such a set once (evaluation/frozen.py)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

import orjson
from tqdm import tqdm

from ..settings import Settings
from . import CommandFailed, PreconditionError, UsageError
from .common import (
    add_home_argument,
    load_settings,
    run_campaign,
    show_progress,
    with_run_progress,
)

MAX_LIVE = 20  # live starts per held-out size: each session is several real launches
RECORDED_STARTS, RECORDED_QUICK_STARTS, MAX_STARTS = 50, 20, 1000


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "evaluate", help="measure held-out sizes and score the model against baselines"
    )
    parser.add_argument("--quick", action="store_true", help="two held-out sizes per workload")
    parser.add_argument(
        "--freeze",
        action="store_true",
        help="draw a test set and write it down before any of it is measured "
        "(HOME/evaluation/frozen/<sha256>.json): sizes inside and 2-4x beyond the trained "
        "range, a kernel and a recorded device the model never saw; measure it with --final",
    )
    parser.add_argument(
        "--final",
        action="store_true",
        help="measure a frozen set once, for the headline figures (the newest, or --set); a "
        "second measured run of a set is refused; with --no-measure: a re-score",
    )
    parser.add_argument(
        "--set",
        dest="frozen_set",
        metavar="HASH_OR_PATH",
        help="with --final: the frozen set, by a prefix of its SHA-256 or its file",
    )
    parser.add_argument(
        "--cell-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --freeze: the most predicted measurement time of an extrapolated cell "
        "(default 1200)",
    )
    parser.add_argument(
        "--workload",
        action="append",
        dest="workloads",
        help="only this workload (repeatable; default: every workload the model knows)",
    )
    parser.add_argument(
        "--sizes",
        help='held-out sizes instead of the profile\'s: "240,300" for every workload, or '
        '"gemm=240,montecarlo=300000" (then only the workloads named, unless --workload '
        "says which)",
    )
    parser.add_argument("--repeats", type=int, help="timed repeats per configuration")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of random search, TPE and the random order of the interleaved rounds "
        "(default 0; --freeze: also of the cells drawn; --final: the set's)",
    )
    parser.add_argument(
        "--truth-repeats", type=int, help="timed repeats per configuration in the truth pass"
    )
    parser.add_argument(
        "--truth-all",
        action="store_true",
        help="the truth pass re-measures every configuration (default: those within 15 %% of "
        "the observed best and those a session ended on)",
    )
    parser.add_argument(
        "--no-truth", action="store_true", help="skip the truth pass (observed scoring only)"
    )
    parser.add_argument(
        "--separate-passes",
        action="store_true",
        help="with --truth-all: measure the truth pass after the observed pass and the live "
        "sessions, as before 5 Dec 2026 (default: each size's two passes in one window, their "
        "rounds interleaved, its live sessions inside it)",
    )
    parser.add_argument(
        "--no-measure",
        action="store_true",
        help="replay the held-out landscape already in the log; measure nothing",
    )
    parser.add_argument(
        "--no-guard", action="store_true", help="skip the leave-one-kernel-out retraining"
    )
    parser.add_argument(
        "--live",
        type=int,
        default=0,
        metavar="N",
        help="also run the model's tuning sessions for real on each held-out size, from its "
        "recommendation and from N seeded random starts, and score them on the truth pass "
        "beside the replay of the same starts (default 0: replay only)",
    )
    parser.add_argument(
        "--starts",
        type=int,
        default=None,
        metavar="N",
        help=f"a recorded workload: seeded starts each policy tunes from (default "
        f"{RECORDED_STARTS}, {RECORDED_QUICK_STARTS} with --quick)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..api import NoModelError, load
    from ..evaluation import EVAL_PROFILES, plan_held_out
    from ..evaluation.plan import parse_sizes
    from ..workloads import UnknownWorkload, get_workload
    from ..workloads.recorded import RecordedWorkload

    settings = load_settings(quiet=True, home=args.home)
    try:
        model = load(settings.home)
    except NoModelError as error:
        raise PreconditionError(str(error)) from None
    frozen = _final_set(settings, args, model) if args.final else None
    if frozen is None:
        args.seed = 0 if args.seed is None else args.seed
    profile = frozen.profile if frozen else EVAL_PROFILES["quick" if args.quick else "full"]
    if args.repeats is not None:
        if args.repeats < 2:
            raise UsageError("--repeats must be at least 2 (the noise needs two runs)")
        profile = replace(profile, repeats=args.repeats)
    if args.truth_repeats is not None:
        if args.truth_repeats < 5:
            raise UsageError("--truth-repeats must be at least 5")
        profile = replace(profile, truth_repeats=args.truth_repeats)
    if args.freeze:
        return _freeze(settings, args, model, profile)
    if args.cell_budget is not None:
        raise UsageError("--cell-budget goes with --freeze")
    if args.frozen_set and not args.final:
        raise UsageError("--set goes with --final (the frozen set to measure)")
    if args.live < 0 or args.live > MAX_LIVE:
        raise UsageError(f"--live {args.live}: accepted is 0 to {MAX_LIVE} starts per size")
    if args.separate_passes and not args.truth_all:
        raise UsageError(
            "--separate-passes only applies with --truth-all: without it the truth pass "
            "measures what the sessions ended on, so it always comes after them"
        )
    if args.live and (args.no_measure or args.no_truth):
        raise UsageError(
            "--live runs sessions for real and scores them on the truth pass: it cannot go "
            "with --no-measure or --no-truth"
        )
    names = list(frozen.sizes) if frozen else args.workloads or sorted(model.workloads)
    unknown = sorted(set(names) - set(model.workloads))
    if unknown:
        raise UsageError(
            f"the model was not trained on {unknown}; it knows {sorted(model.workloads)}"
        )
    try:
        workloads = [get_workload(name) for name in names]
    except UnknownWorkload as error:
        raise UsageError(str(error)) from None
    recorded = [w for w in workloads if isinstance(w, RecordedWorkload)]
    if recorded and (args.workloads or len(recorded) == len(workloads)):
        if len(recorded) != len(workloads):
            raise UsageError(
                f"{', '.join(w.name for w in recorded)}: a recorded workload is evaluated on "
                "its own landscape, not on held-out sizes: name recorded workloads alone, "
                "or only built-in and TOML ones"
            )
        return _recorded(settings, args, model, recorded)
    workloads = [w for w in workloads if not isinstance(w, RecordedWorkload)]
    try:
        sizes = (
            dict(frozen.sizes) if frozen else parse_sizes(args.sizes, names) if args.sizes else None
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    if sizes and not args.workloads:
        # "--sizes montecarlo=X" asks about montecarlo: the other workloads' profile sizes
        # would cost their measurements and answer nothing that was asked
        workloads = [w for w in workloads if w.name in sizes]
    if sizes and not args.final:
        _refuse_frozen_sizes(settings, model, sizes)
    spaces = {w.name: model.space_for(w.name) for w in workloads}
    chunks = plan_held_out(workloads, spaces, profile, sizes)
    if frozen:  # a built-in kernel the model never saw: its configurations measured too
        chunks += frozen.unseen_chunks(model, profile)
    trained = {(w, s) for w, ss in model.sizes.items() for s in ss}
    overlap = sorted({(j.workload, j.size) for c in chunks for j in c} & trained)
    if overlap:
        raise UsageError(
            "these sizes were used in training, so they cannot be held out: "
            + ", ".join(f"{w} {s}" for w, s in overlap)
        )
    return asyncio.run(_evaluate(settings, args, model, profile, chunks, frozen))


def _freeze(settings: Settings, args: argparse.Namespace, model: Any, profile: Any) -> int:
    """`evaluate --freeze`: draw a test set and write it down; nothing is measured."""
    from ..evaluation import frozen as fz
    from ..workloads import get_workload
    from ..workloads.recorded import RecordedWorkload

    refused = [
        flag
        for flag, given in (
            ("--final", args.final),
            ("--set", args.frozen_set),
            ("--quick", args.quick),
            ("--sizes", args.sizes),
            ("--no-measure", args.no_measure),
            ("--live", args.live),
            ("--truth-all", args.truth_all),
            ("--no-truth", args.no_truth),
            ("--separate-passes", args.separate_passes),
            ("--no-guard", args.no_guard),
            ("--starts", args.starts is not None),
        )
        if given
    ]
    if refused:
        raise UsageError(
            f"{', '.join(refused)}: not with --freeze, which only draws and writes a test set; "
            "accepted: --seed, --workload, --repeats, --truth-repeats, --cell-budget, --json"
        )
    if args.cell_budget is not None and args.cell_budget <= 0:
        raise UsageError(f"--cell-budget {args.cell_budget}: give a positive number of seconds")
    names = args.workloads or sorted(model.workloads)
    unknown = sorted(set(names) - set(model.workloads))
    if unknown:
        raise UsageError(
            f"the model was not trained on {unknown}; it knows {sorted(model.workloads)}"
        )
    workloads = [get_workload(n) for n in names if n in model.workloads]
    recorded = [w.name for w in workloads if isinstance(w, RecordedWorkload)]
    if recorded and args.workloads:
        raise UsageError(
            f"{', '.join(recorded)}: a recorded workload has one size, nothing to draw sizes "
            "from; name built-in or TOML workloads"
        )
    workloads = [w for w in workloads if not isinstance(w, RecordedWorkload)]
    seed = 0 if args.seed is None else args.seed
    machine = fz.Machine.here(
        settings.max_run_s, fz.CELL_BUDGET_S if args.cell_budget is None else args.cell_budget
    )
    drawn = fz.draw(
        model,
        workloads,
        seed=seed,
        machine=machine,
        repeats=profile.repeats,
        truth_repeats=profile.truth_repeats,
        earlier=fz.earlier_cells(settings.home),
    )
    if not any(c["kind"] in fz.MEASURED_KINDS for c in drawn.cells):
        raise CommandFailed(
            "no size could be drawn for any workload: "
            + "; ".join(f"{a.get('workload', a['kind'])}: {a['reason']}" for a in drawn.absent)
        )
    document = fz.document_for(
        model,
        drawn,
        seed=seed,
        repeats=profile.repeats,
        truth_repeats=profile.truth_repeats,
        workloads=[w.name for w in workloads],
    )
    path = fz.write(settings.home, document)
    if args.json:
        print(
            orjson.dumps(
                {"file": str(path), **document}, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
            ).decode()
        )
        return 0
    code = document["code"]
    print(
        f"froze a test set of {len(document['cells'])} cells for model {model.version} on "
        f"device {model.device_id}, seed {seed}; nothing of it is measured yet"
    )
    print(f"  file    {path}")
    print(f"  sha256  {document['sha256']}")
    print(
        "  code    "
        + (
            f"commit {code['commit']}" + (" (with local changes)" if code.get("modified") else "")
            if code["commit"]
            else f"package version {code['version']} (not a git checkout)"
        )
    )
    for cell in document["cells"]:
        extra = ""
        if cell["kind"] == "extrapolation":
            extra = f" ({cell['times_largest_trained']}x the largest trained size)"
        elif cell["kind"] == "unseen_kernel":
            extra = f" ({cell['source']})"
        elif cell["kind"] == "unseen_device":
            extra = f" (recorded {cell['device']})"
        print(f"  {cell['kind']:14} {cell['workload']} {cell['size']}{extra}")
    for entry in document["absent"]:
        who = f" {entry['workload']}" if "workload" in entry else ""
        print(f"  no {entry['kind']}{who}: {entry['reason']}")
    print(
        "Measure it once with `hpc-ds1 evaluate --final` (the newest set; --set "
        f"{document['sha256'][:12]} names this one). Choices are made on the development set "
        "only: a new set is frozen for the next headline."
    )
    return 0


class _FinalSet:
    """The frozen set `--final` measures: verified, for this model; `claim` marks it measured."""

    def __init__(self, path: Path, document: dict[str, Any], rescore: bool) -> None:
        from ..evaluation import frozen as fz
        from ..evaluation.plan import frozen_profile

        self.path, self.document, self.rescore = path, document, rescore
        self.sha256: str = document["sha256"]
        self.seed: int = int(document["seed"])
        self.profile = frozen_profile(
            int(document["profile"]["repeats"]), int(document["profile"]["truth_repeats"])
        )
        self.sizes = fz.sizes_by_workload(document)
        self.claimed: Path | None = None

    def unseen_chunks(self, model: Any, profile: Any) -> list[Any]:
        from ..evaluation import frozen as fz
        from ..evaluation import plan_held_out
        from ..workloads import UnknownWorkload, get_workload

        chunks: list[Any] = []
        for cell in fz.cells_of(self.document, "unseen_kernel"):
            if not fz.measured_built_in(cell):
                continue
            try:
                wl = get_workload(cell["workload"])
            except UnknownWorkload as error:
                raise PreconditionError(f"the set's unseen kernel: {error}") from None
            spaces = {wl.name: model.space_for(wl.name)}
            chunks += plan_held_out([wl], spaces, profile, {wl.name: [int(cell["size"])]})
        return chunks

    def claim(self, args: argparse.Namespace) -> None:
        from ..evaluation import frozen as fz

        if self.rescore:
            return
        try:
            self.claimed = fz.claim(
                self.path, {"sha256": self.sha256, "argv": sys.argv[1:], "seed": args.seed}
            )
        except fz.FrozenSetError as error:
            raise PreconditionError(str(error)) from None


def _final_set(settings: Settings, args: argparse.Namespace, model: Any) -> _FinalSet:
    """The frozen set `--final` measures: found, verified, for this model, not yet measured
    (unless --no-measure re-scores it); the flags that would change it refused."""
    from ..evaluation import frozen as fz

    refused = [
        flag
        for flag, given in (
            ("--freeze", args.freeze),
            ("--quick", args.quick),
            ("--sizes", args.sizes),
            ("--workload", args.workloads),
            ("--repeats", args.repeats is not None),
            ("--truth-repeats", args.truth_repeats is not None),
            ("--cell-budget", args.cell_budget is not None),
            ("--starts", args.starts is not None),
        )
        if given
    ]
    if refused:
        raise UsageError(
            f"{', '.join(refused)}: not with --final, which measures a frozen set as it was "
            "frozen (its cells, seed and repeats); pick the set with --set"
        )
    try:
        path = fz.find(settings.home, args.frozen_set)
        document = fz.load_verified(path)
        fz.check_model(document, model)
    except fz.EditedSet as error:
        raise CommandFailed(str(error)) from None
    except fz.FrozenSetError as error:
        raise PreconditionError(str(error)) from None
    if args.seed is not None and args.seed != document["seed"]:
        raise UsageError(
            f"--seed {args.seed}: set {path.stem} was frozen with seed {document['seed']}, "
            "which --final uses"
        )
    args.seed = int(document["seed"])
    if not args.no_measure and fz.marker(path).exists():
        raise PreconditionError(fz.measured_message(path))
    return _FinalSet(path, document, rescore=args.no_measure)


def _refuse_frozen_sizes(settings: Settings, model: Any, sizes: dict[str, list[int]]) -> None:
    """--sizes may not measure a cell of a frozen set for this model that is not measured yet:
    only its one `--final` run looks at it."""
    from ..evaluation import frozen as fz

    taken = []
    for path, document in fz.listed(settings.home):
        if not isinstance(document, dict) or fz.marker(path).exists():
            continue
        if (document.get("model") or {}).get("version") != model.version:
            continue
        cells = {(c.get("workload"), c.get("size")) for c in document.get("cells", ())}
        taken += [(w, s, path.stem) for w, ss in sizes.items() for s in ss if (w, s) in cells]
    if taken:
        raise UsageError(
            "these sizes belong to a frozen test set not measured yet, which only `--final` "
            "measures: " + ", ".join(f"{w} {s} (set {p})" for w, s, p in sorted(taken))
        )


def _recorded(
    settings: Settings, args: argparse.Namespace, model: Any, workloads: list[Any]
) -> int:
    """`evaluate` of recorded workloads: each landscape replayed (evaluation/recorded.py)."""
    refused = [
        flag
        for flag, given in (
            ("--final", args.final),
            ("--sizes", args.sizes),
            ("--live", args.live),
            ("--repeats", args.repeats is not None),
            ("--truth-repeats", args.truth_repeats is not None),
            ("--truth-all", args.truth_all),
            ("--separate-passes", args.separate_passes),
        )
        if given
    ]
    if refused:
        raise UsageError(
            f"{', '.join(refused)}: not for a recorded workload, whose landscape is its file "
            "(one size, nothing to measure); accepted: --quick, --starts, --seed, --json"
        )
    starts = args.starts or (RECORDED_QUICK_STARTS if args.quick else RECORDED_STARTS)
    if not 1 <= starts <= MAX_STARTS:
        raise UsageError(f"--starts {starts}: accepted is 1 to {MAX_STARTS}")
    return asyncio.run(_evaluate_recorded(settings, args, model, workloads, starts))


async def _evaluate_recorded(
    settings: Settings, args: argparse.Namespace, model: Any, workloads: list[Any], starts: int
) -> int:
    from ..evaluation import EvaluationError
    from ..evaluation.recorded import evaluate_recorded, render
    from ..stack import open_stack

    info = sys.stderr if args.json else sys.stdout
    published = []
    async with open_stack(settings, ("projector",), "evaluate") as stack:
        device_id = await stack.local_device()
        if model.device_id != device_id:
            raise PreconditionError(
                f"the model in {settings.models_dir} was trained on device {model.device_id}, "
                f"not this one ({device_id}): run `hpc-ds1 setup` here first"
            )
        await stack.caught_up()
        training, _ = await asyncio.to_thread(_load, stack.engine, device_id, set())
        for workload in workloads:
            print(
                f"evaluate {workload.name}: model {model.version}, its recorded landscape "
                f"replayed from {starts} starts, seed {args.seed}",
                flush=True,
                file=info,
            )
            mine = [m for m in training if m.workload == workload.name and not m.held_out]
            try:
                results, _, _ = await asyncio.to_thread(
                    evaluate_recorded, model, workload, mine, seed=args.seed, starts=starts
                )
            except EvaluationError as error:
                raise CommandFailed(str(error)) from None
            results["profile"] = "recorded"
            evaluation_id = await _publish(
                stack, device_id, model, "recorded", args.seed, results, None
            )
            published.append({"evaluation_id": evaluation_id, **results})
            if not args.json:
                print(render(results), flush=True)
    if args.json:
        document = published[0] if len(published) == 1 else {"evaluations": published}
        print(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode())
    return 0


async def _evaluate(
    settings: Settings,
    args: argparse.Namespace,
    model: Any,
    eval_profile: Any,
    chunks: list[Any],
    frozen: _FinalSet | None = None,
) -> int:
    from ..evaluation import EvaluationError, evaluate
    from ..evaluation import frozen as fz
    from ..evaluation.live import run_stats
    from ..evaluation.report import render
    from ..evaluation.run import truth_plan
    from ..machine.hardware import Fingerprint
    from ..setup.plan import PlannedJob
    from ..stack import open_stack

    profile = eval_profile.name
    async with open_stack(settings, ("projector", "agent"), "evaluate") as stack:
        device_id = await stack.local_device()
        if model.device_id != device_id:
            raise PreconditionError(
                f"the model in {settings.models_dir} was trained on device {model.device_id}, "
                f"not this one ({device_id}): run `hpc-ds1 setup` here first"
            )
        fingerprint = Fingerprint.model_validate(model.fingerprint)
        info = sys.stderr if args.json else sys.stdout  # --json: stdout holds the JSON only
        print(
            f"evaluate ({profile}) model {model.version} on device {device_id} · "
            f"{sum(len(c) for c in chunks)} held-out runs ({eval_profile.repeats} repeats in "
            f"interleaved rounds) · held-out set "
            + (
                f"frozen {frozen.sha256[:12]}" + (" (re-score)" if frozen.rescore else "")
                if frozen
                else "development"
            )
            + f" · seed {args.seed} · home {settings.home}",
            flush=True,
            file=info,
        )
        if frozen is not None:  # claimed before anything is measured: a set is measured once
            frozen.claim(args)
        observed_report = truth_report = None
        live: list[Any] = []
        live_runs: list[Any] = []
        # --truth-all knows the truth pass's configurations before any session ends, so each
        # size's two passes (and its live sessions) can share one window of time
        windows = args.truth_all and not (args.no_truth or args.no_measure or args.separate_passes)
        if windows:
            live_sessions = (
                _LiveSessions(stack, device_id, model, args, info) if args.live else None
            )
            observed_report, truth_report = await _measure_windows(
                stack, device_id, chunks, eval_profile.truth_repeats, info, args.seed, live_sessions
            )
            if live_sessions is not None:
                live, live_runs = live_sessions.outcomes, live_sessions.runs
        elif not args.no_measure:
            observed_report = await _measure(stack, device_id, chunks, info, "evaluate", args.seed)
        await stack.caught_up()
        wanted = {(j.workload, j.size) for c in chunks for j in c}
        rows, truth_rows = await asyncio.to_thread(_load, stack.engine, device_id, wanted)
        with tqdm(
            total=1,
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=not show_progress(),
        ) as bar:
            shown: list[str] = []  # a disabled bar (no terminal) keeps no description

            def progress(phase: str, done: int, total: int) -> None:
                if shown[-1:] != [phase]:
                    shown.append(phase)
                    bar.reset(total=total)
                    bar.set_description_str(phase)
                bar.update(done - bar.n)

            try:
                if args.live and not windows:
                    live_sessions = _LiveSessions(stack, device_id, model, args, info)
                    await live_sessions.run(rows)
                    live, live_runs = live_sessions.outcomes, live_sessions.runs
                if not args.no_truth and not windows:
                    plan = await asyncio.to_thread(
                        truth_plan,
                        model,
                        rows,
                        seed=args.seed,
                        everything=args.truth_all,
                        progress=progress,
                        live=live,
                    )
                    truth_chunks = [
                        [PlannedJob(w, s, c, eval_profile.truth_repeats) for c in configs]
                        for (w, s), configs in sorted(plan.items())
                    ]
                    print(
                        f"\ntruth pass: {sum(len(c) for c in truth_chunks)} configurations "
                        f"re-measured, {eval_profile.truth_repeats} repeats in interleaved "
                        f"rounds, seed {args.seed}",
                        flush=True,
                        file=info,
                    )
                    if not args.no_measure:
                        truth_report = await _measure(
                            stack, device_id, truth_chunks, info, "truth", args.seed
                        )
                        await stack.caught_up()
                        rows, truth_rows = await asyncio.to_thread(
                            _load, stack.engine, device_id, wanted
                        )
                evaluation = await asyncio.to_thread(
                    evaluate,
                    model,
                    rows,
                    fingerprint,
                    seed=args.seed,
                    guard_retrain=not args.no_guard,
                    progress=progress,
                    truth=None if args.no_truth else truth_rows,
                    truth_repeats=eval_profile.truth_repeats,
                    live=live,
                )
                if live and evaluation.results.get("live"):
                    evaluation.results["live"].update(run_stats(live_runs))
            except EvaluationError as error:  # the data cannot be scored: a failure (1)
                raise CommandFailed(str(error)) from None
        results = evaluation.results
        results["profile"] = profile
        results["held_out_set"] = "frozen" if frozen else "development"
        if frozen is not None:
            results["frozen_set"] = fz.summary(
                frozen.path, frozen.document, rescore=frozen.rescore, claimed=frozen.claimed
            )
            results["by_kind"] = fz.by_kind(frozen.document, evaluation.sessions, evaluation.checks)
            results["unseen"] = await asyncio.to_thread(
                fz.unseen,
                model,
                frozen.document,
                rows,
                [] if args.no_truth else truth_rows,
                model.thresholds,
            )
        results["measurement"] = {
            "order": "interleaved rounds, seeded random order (ranks blocks, then "
            "configurations, shuffled every round)"
            + (
                "; each size's observed and truth rounds in one window, interleaved"
                + (", its live sessions inside it" if args.live else "")
                if windows
                else ""
            ),
            "passes": "one window per size" if windows else "apart",
            "observed_repeats": eval_profile.repeats,
            "observed_runs_measured": observed_report.measured if observed_report else 0,
            "observed_seconds": round(observed_report.seconds, 1) if observed_report else None,
            "truth_runs_measured": truth_report.measured if truth_report else 0,
            "truth_seconds": round(truth_report.seconds, 1) if truth_report else None,
        }
        plot = await asyncio.to_thread(_plot, settings.home, model, profile, evaluation)
        evaluation_id = await _publish(stack, device_id, model, profile, args.seed, results, plot)
        if frozen is not None and frozen.claimed is not None:
            fz.finished(frozen.path, evaluation_id)
    if args.json:
        print(
            orjson.dumps(
                {"evaluation_id": evaluation_id, **results}, option=orjson.OPT_INDENT_2
            ).decode()
        )
        return 0
    print(render(results))
    print("\nTargets")
    for t in results["targets"]:
        verdict = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        print(f"  {verdict:7} {t['target']}: {t['value']} (goal {t['goal']})")
        if t.get("note"):
            print(f"          {t['note']}")
    if frozen is not None:
        print(fz.render(results))
    print(f"\nevaluation {evaluation_id} · plot {plot} · {results['seconds']:.0f} s of replay")
    return 0


async def _measure(
    stack: Any, device_id: str, chunks: list[Any], info: TextIO, purpose: str, seed: int
) -> Any:
    from ..setup import Campaign

    campaign = Campaign(stack, device_id, purpose=purpose, held_out=True, seed=seed)
    report = await run_campaign(campaign, chunks)
    print(
        f"measured {report.measured} held-out runs ({purpose}) in {report.seconds:.0f} s "
        f"({report.skipped} already in the log; by status {report.by_status})",
        flush=True,
        file=info,
    )
    return report


async def _measure_windows(
    stack: Any,
    device_id: str,
    chunks: list[Any],
    truth_repeats: int,
    info: TextIO,
    seed: int,
    live: _LiveSessions | None,
) -> tuple[Any, Any]:
    """Both passes, one window per held-out size (setup.campaign.measure_windows); with `live`,
    the size's live sessions run inside its window, after its observed pass."""
    from ..setup import Campaign
    from ..setup.campaign import measure_windows

    observed = Campaign(stack, device_id, purpose="evaluate", held_out=True, seed=seed)
    truth = Campaign(stack, device_id, purpose="truth", held_out=True, seed=seed)
    print(
        f"observed and truth passes: one window per size, their rounds interleaved "
        f"({truth_repeats} truth repeats, every configuration), seed {seed}"
        + ("; each size's live sessions inside its window" if live else ""),
        flush=True,
        file=info,
    )

    async def between(workload: str, size: int) -> None:
        assert live is not None
        await stack.caught_up()
        rows, _ = await asyncio.to_thread(_load, stack.engine, device_id, {(workload, size)})
        await live.run(rows)

    reports = await with_run_progress(
        2 * sum(len(c) for c in chunks),
        lambda progress: measure_windows(
            observed, truth, chunks, truth_repeats, progress, between if live else None
        ),
    )
    for purpose, report in zip(("evaluate", "truth"), reports, strict=True):
        print(
            f"measured {report.measured} held-out runs ({purpose}) in {report.seconds:.0f} s "
            f"({report.skipped} already in the log; by status {report.by_status})",
            flush=True,
            file=info,
        )
    return reports


class _LiveSessions:
    """The live sessions (evaluation/live.py), each run recorded as a held-out measurement of
    purpose "live" (which neither training nor the observed pass reads); `run` takes the
    sessions of every held-out size among its rows, and may be called once per size."""

    def __init__(
        self, stack: Any, device_id: str, model: Any, args: argparse.Namespace, info: TextIO
    ) -> None:
        from ..evaluation.live import device_runs
        from ..requests import RUN_REPEATS

        self.stack = stack
        self.device_id = device_id
        self.model = model
        self.args = args
        self.info = info
        self.stop = threading.Event()
        self.run_fn = device_runs(
            stack.settings.home, model.space_for, stack.settings.max_run_s, self.stop
        )
        self.outcomes: list[Any] = []
        self.runs: list[Any] = []
        print(
            f"\nlive sessions: from the recommendation and {args.live} seeded starts per size, "
            f"every run real ({RUN_REPEATS} timed repeats after a warm-up, as `tune`)",
            flush=True,
            file=info,
        )

    async def run(self, rows: list[Any]) -> None:
        from ..evaluation.run import run_live
        from ..events import envelope
        from ..measure import measurement_event

        loop = asyncio.get_running_loop()

        def record(outcome: Any, runs: list[Any]) -> None:
            self.runs.extend(runs)
            envelopes = [
                envelope(
                    measurement_event(r.result, self.device_id, "live", held_out=True),
                    actor="evaluate",
                    source="evaluate",
                    prefix=self.stack.settings.subject_prefix,
                )
                for r in runs
            ]
            asyncio.run_coroutine_threadsafe(self.stack.bus.publish_many(envelopes), loop).result()
            print(
                f"live session {len(self.outcomes) + 1}: {outcome.workload} {outcome.size} "
                f"{outcome.policy} from {outcome.start.label()} -> {outcome.final.label()} in "
                f"{outcome.runs} runs, {outcome.cost_s:.1f} s ({outcome.finish})",
                flush=True,
                file=self.info,
            )
            self.outcomes.append(outcome)

        try:
            await asyncio.to_thread(
                run_live,
                self.model,
                rows,
                self.args.live,
                self.run_fn,
                seed=self.args.seed,
                on_session=record,
            )
        except asyncio.CancelledError:
            # Ctrl-C: the thread cannot be cancelled and asyncio.run waits for it; the launch
            # that runs is stopped and no other starts, instead of running every remaining
            # session
            self.stop.set()
            raise
        await self.stack.caught_up()


def _load(
    engine: Any, device_id: str, held_sizes: set[tuple[str, int]]
) -> tuple[list[Any], list[Any]]:
    """The device's training measurements and its observed held-out ones at the sizes asked
    for; apart, the truth pass's measurements at those sizes."""
    from ..db.reads import load_measurements
    from ..evaluation.truth import split_passes

    return split_passes(
        row
        for row in load_measurements(engine, device_id)
        if not row["held_out"] or (row["workload"], row["size"]) in held_sizes
    )


def _plot(home: Path, model: Any, profile: str, evaluation: Any) -> str:
    from ..evaluation.plot import write_plot

    name = f"{model.version}-{profile}.png"
    write_plot(
        home / "evaluation" / name,
        evaluation.sessions,
        evaluation.checks,
        evaluation.results["calibration"]["reliability"],
        f"model {model.version} · held-out sizes · seed {evaluation.results['seed']}",
    )
    return name


async def _publish(
    stack: Any,
    device_id: str,
    model: Any,
    profile: str,
    seed: int,
    results: dict[str, Any],
    plot: str | None,
) -> str:
    from ..events import EvaluationPublished, envelope, new_id

    evaluation_id = new_id()
    event = EvaluationPublished(
        evaluation_id=evaluation_id,
        device_id=device_id,
        model_version=model.version,
        profile=profile,
        seed=seed,
        landscape_runs=results["landscape"]["measurements"],
        results=orjson.loads(orjson.dumps(results, default=str)),
        plots=[] if plot is None else [plot],
    )
    await stack.bus.publish(
        envelope(event, actor="evaluate", source="evaluate", prefix=stack.settings.subject_prefix)
    )
    await stack.caught_up()
    return evaluation_id
