"""A frozen test set (issue 43, item 3): cells drawn and written down before any of them is
measured, then measured once by `hpc-ds1 evaluate --final`.

`hpc-ds1 evaluate --freeze` draws the cells from a seed and writes them, with the model's version
and device, the code's commit, the seed and the measurement profile, to
`HOME/evaluation/frozen/<first 12 hex of its SHA-256>.json`. The SHA-256 is taken over the
canonical JSON of every field but `sha256` itself (sorted keys, no spaces: `canonical`), so an
edited file no longer verifies. The cells, by kind:

- `interpolation`: sizes inside the model's trained range of a workload it knows, on the grid
  of the workload's own sizes, that are neither its training sizes nor any of its registered
  held-out sizes (every one of those was looked at during development), nor a cell of an
  earlier frozen set;
- `extrapolation`: one size 2 to 4x the largest trained size, where it fits this machine
  comfortably: every configuration within MEMORY_SHARE of its memory (and what the runner
  accepts now), the slowest predicted run within the run cap, the cell's predicted measurement
  time within the cell budget. A size that does not fit is not drawn; a workload with none
  that fits gets no extrapolation cell, and the set says why;
- `unseen_kernel`: a registered workload (built-in, TOML file or plug-in) the model was never
  trained on, at its smallest own size; where none exists the set says so, and the guard's
  leave-one-kernel-out retraining (`evaluate` without `--no-guard`) stands in for it;
- `unseen_device`: a recorded workload (a recorded GPU, `workloads/recorded.py`) registered in
  the home that the model was never trained on; where none exists the set says so.

`--final` verifies the file, refuses a set frozen for another model version or device, and
claims the set before it measures anything by creating `<name>.measured` beside it with
O_EXCL: a second measured run of the same set is refused, and so is one after a run that
crashed midway (it may have looked at part of the set). `--final --no-measure` re-scores what
was measured and claims nothing."""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import os
import random
import re
import socket
import subprocess
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from hpc_ds1.model import Measurement, Model, Thresholds
from hpc_ds1.workloads import Workload

FORMAT = 1
KINDS = ("interpolation", "extrapolation", "unseen_kernel", "unseen_device")
MEASURED_KINDS = ("interpolation", "extrapolation")  # through the held-out path of evaluate
INTERPOLATION_PER_WORKLOAD = 2
EXTRAPOLATION = (2.0, 4.0)  # the range of an extrapolated size, in multiples of the largest
MEMORY_SHARE = 0.25  # of this machine's memory: the most an extrapolated job may need
SLOW_MARGIN = 3.0  # the slowest predicted run, times this, must stay within the run cap
CELL_BUDGET_S = 1200.0  # predicted seconds to measure an extrapolated cell (both passes)
STAND_IN = (
    "the guard's leave-one-kernel-out retraining (`evaluate` without --no-guard) stands in: "
    "each trained kernel in turn is left out and the guard's flags on it are counted"
)


class FrozenSetError(Exception):
    """A frozen set that cannot be used as asked: the message says why and what to do."""


class EditedSet(FrozenSetError):
    """The file does not verify against its own SHA-256."""


def frozen_dir(home: Path) -> Path:
    return Path(home) / "evaluation" / "frozen"


def canonical(document: Mapping[str, Any]) -> bytes:
    """The bytes the SHA-256 is taken over: every field but `sha256`, keys sorted, compact."""
    return orjson.dumps(
        {k: v for k, v in document.items() if k != "sha256"}, option=orjson.OPT_SORT_KEYS
    )


def digest(document: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(document)).hexdigest()


def code_version() -> dict[str, Any]:
    """The code's commit where the package runs from a git checkout (its files tracked there),
    with whether they differ from it; else the package's version."""
    from hpc_ds1.version import __version__

    package = Path(__file__).resolve().parents[1]
    try:
        git = ["git", "-C", str(package)]
        tracked = subprocess.run(
            [*git, "ls-files", "--error-unmatch", "__init__.py"],
            capture_output=True,
            timeout=10,
        )
        if tracked.returncode == 0:
            commit = subprocess.run(
                [*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            )
            changed = subprocess.run(
                [*git, "status", "--porcelain", "--untracked-files=no", "--", "."],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if commit.returncode == 0 and changed.returncode == 0:
                return {
                    "source": "git commit",
                    "commit": commit.stdout.strip(),
                    "modified": bool(changed.stdout.strip()),
                    "version": __version__,
                }
    except (OSError, subprocess.SubprocessError):
        pass
    return {"source": "package version", "commit": None, "version": __version__}


# --- drawing the cells --------------------------------------------------------------------


@dataclass
class Machine:
    """What decides whether an extrapolated size fits: this machine's memory now, the run cap
    and the cell budget."""

    total_bytes: int
    available_bytes: int
    max_run_s: float
    cell_budget_s: float = CELL_BUDGET_S

    @classmethod
    def here(cls, max_run_s: float, cell_budget_s: float = CELL_BUDGET_S) -> Machine:
        import psutil

        memory = psutil.virtual_memory()
        return cls(int(memory.total), int(memory.available), max_run_s, cell_budget_s)


@dataclass
class Drawn:
    cells: list[dict[str, Any]] = field(default_factory=list)
    absent: list[dict[str, Any]] = field(default_factory=list)


def _grid(sizes: Iterable[int]) -> int:
    return max(1, math.gcd(*(int(s) for s in sizes)))


def _inside(lo: int, hi: int, step: int, excluded: set[int]) -> list[int]:
    first = -(-lo // step) * step
    return [s for s in range(first, hi + 1, step) if lo < s < hi and s not in excluded]


def _rng(seed: int, *parts: object) -> random.Random:
    return random.Random(":".join(str(p) for p in (seed, *parts)))


def _interpolation(
    model: Model, wl: Workload, seed: int, excluded: set[int], n: int
) -> tuple[list[int], str | None]:
    trained = sorted(model.sizes[wl.name])
    lo, hi = trained[0], trained[-1]
    step = _grid([*trained, *wl.sizes, *wl.held_out])
    found = _inside(lo, hi, step, excluded)
    while len(found) < 2 * n and step > 1:  # room to draw from: a finer grid
        step = max(1, step // 2)
        found = _inside(lo, hi, step, excluded)
    found = [s for s in found if s >= wl.min_size(1)]
    if not found:
        return [], (
            f"no size inside the trained range {lo}-{hi} that is neither a training size, a "
            "registered held-out size nor a cell of an earlier frozen set"
        )
    return sorted(_rng(seed, wl.name, "interpolation").sample(found, min(n, len(found)))), None


def _work_ratio(wl: Workload, size: int, base: int) -> float:
    """How much more work a run at `size` does than one at `base`: the throughput's amount
    where the workload states it, else its items, else the sizes' ratio."""
    a, b = wl.work(size), wl.work(base)
    for there, here in (
        (a.flops, b.flops) if wl.throughput_unit == "GFLOP/s" else (a.bytes_moved, b.bytes_moved),
        (a.items, b.items),
    ):
        if there > 0 and here > 0:
            return float(there / here)
    return size / base


def fit_problem(
    model: Model,
    wl: Workload,
    size: int,
    machine: Machine,
    repeats: int,
    truth_repeats: int,
    predicted: Sequence[float] | None = None,
) -> tuple[str | None, dict[str, Any]]:
    """Why `size` of `wl` does not fit this machine comfortably (None when it does), and the
    estimates: the memory of its largest job, the slowest and the summed predicted runs."""
    from hpc_ds1.runner.checks import MEMORY_FRACTION, RANK_OVERHEAD_BYTES

    space = model.space_for(wl.name)
    ranks = sorted({c.ranks for c in space.configs()}) or [1]
    need = max(wl.memory(size, r) + r * RANK_OVERHEAD_BYTES for r in ranks)
    limit = min(MEMORY_SHARE * machine.total_bytes, MEMORY_FRACTION * machine.available_bytes)
    estimate: dict[str, Any] = {"memory_gib": round(need / 2**30, 3)}
    if need > limit:
        return (
            f"size {size} needs about {need / 2**30:.1f} GiB with {ranks[-1]} ranks; a frozen "
            f"cell may take {limit / 2**30:.1f} GiB ({MEMORY_SHARE:.0%} of this machine's "
            "memory, and what the runner accepts now)",
            estimate,
        )
    if predicted:
        largest = max(model.sizes[wl.name])
        ratio = _work_ratio(wl, size, largest)
        slowest = max(predicted) * ratio
        # each round is a warm-up and a timed run of every configuration, in both passes
        cell = sum(predicted) * ratio * 2 * (repeats + truth_repeats)
        estimate.update(slowest_run_s=round(slowest, 2), cell_s=round(cell, 1))
        if slowest * SLOW_MARGIN > machine.max_run_s:
            return (
                f"size {size}: its slowest configuration is predicted at {slowest:.0f} s a run "
                f"(the runs at {largest} scaled by the work), too close to the run cap of "
                f"{machine.max_run_s:.0f} s",
                estimate,
            )
        if cell > machine.cell_budget_s:
            return (
                f"size {size}: measuring it (every configuration, both passes) is predicted at "
                f"{cell / 60:.0f} min, beyond the cell budget of "
                f"{machine.cell_budget_s / 60:.0f} min (--cell-budget)",
                estimate,
            )
    return None, estimate


def _extrapolation(
    model: Model,
    wl: Workload,
    seed: int,
    excluded: set[int],
    machine: Machine,
    repeats: int,
    truth_repeats: int,
) -> tuple[dict[str, Any] | None, str | None]:
    trained = sorted(model.sizes[wl.name])
    largest = trained[-1]
    lo, hi = math.ceil(EXTRAPOLATION[0] * largest), math.floor(EXTRAPOLATION[1] * largest)
    step = _grid([*trained, *wl.sizes, *wl.held_out])
    while step > 1 and not any(
        s not in excluded for s in range(-(-lo // step) * step, hi + 1, step)
    ):
        step = max(1, step // 2)
    found = [s for s in range(-(-lo // step) * step, hi + 1, step) if s not in excluded]
    _rng(seed, wl.name, "extrapolation").shuffle(found)
    space = model.space_for(wl.name)
    predicted = model.predict_runtimes(wl.name, largest, space.configs())[0].tolist()
    problems = []
    for size in found:
        problem, estimate = fit_problem(model, wl, size, machine, repeats, truth_repeats, predicted)
        if problem is None:
            return {
                "workload": wl.name,
                "size": size,
                "kind": "extrapolation",
                "times_largest_trained": round(size / largest, 3),
                "estimate": estimate,
            }, None
        problems.append((size, problem))
    smallest = min(problems, default=None)
    return None, (
        f"no size {lo}-{hi} (2-4x the largest trained size {largest}) fits this machine"
        + (f": {smallest[1]}" if smallest else "")
    )


def _unseen_kernel(
    model: Model, seed: int, machine: Machine, repeats: int, truth_repeats: int
) -> tuple[dict[str, Any] | None, str | None]:
    from hpc_ds1.workloads import get_workload, list_workloads, source_of
    from hpc_ds1.workloads.recorded import RecordedWorkload

    names = [
        n
        for n in list_workloads()
        if n not in model.workloads and not isinstance(get_workload(n), RecordedWorkload)
    ]
    problems = []
    for name in _rng(seed, "unseen_kernel").sample(names, len(names)):
        wl = get_workload(name)
        size = min(wl.sizes) if wl.sizes else None
        if size is None:
            problems.append(f"{name}: no size of its own")
            continue
        problem, estimate = fit_problem(model, wl, size, machine, repeats, truth_repeats)
        if problem is not None:
            problems.append(f"{name}: {problem}")
            continue
        return {
            "workload": name,
            "size": size,
            "kind": "unseen_kernel",
            "source": source_of(name),
            "estimate": estimate,
        }, None
    if problems:
        return None, "no workload the model never saw fits: " + "; ".join(problems)
    return None, "every registered workload was trained on; " + STAND_IN


def _unseen_device(model: Model, seed: int) -> tuple[dict[str, Any] | None, str | None]:
    from hpc_ds1.workloads import get_workload, list_workloads
    from hpc_ds1.workloads.recorded import RecordedWorkload

    names = []
    for name in list_workloads():
        wl = get_workload(name)
        if isinstance(wl, RecordedWorkload) and name not in model.workloads:
            names.append((name, wl))
    if not names:
        return None, (
            "no recorded workload the model was never trained on is registered in this home "
            "(docs/plugins.md, 'A recorded GPU')"
        )
    name, wl = _rng(seed, "unseen_device").choice(names)
    landscape = wl.landscape()
    return {
        "workload": name,
        "size": wl.sizes[0],
        "kind": "unseen_device",
        "device": landscape.device,
        "recorded": Path(wl.recorded).name,
        "recorded_sha256": hashlib.sha256(Path(wl.recorded).read_bytes()).hexdigest(),
    }, None


def earlier_cells(home: Path) -> set[tuple[str, int]]:
    """Every (workload, size) a frozen set of `home` holds, whatever its state."""
    out: set[tuple[str, int]] = set()
    for _, document in listed(home):
        for cell in document.get("cells", ()) if isinstance(document, dict) else ():
            try:
                out.add((str(cell["workload"]), int(cell["size"])))
            except (KeyError, TypeError, ValueError):
                continue
    return out


def draw(
    model: Model,
    workloads: Sequence[Workload],
    *,
    seed: int,
    machine: Machine,
    repeats: int,
    truth_repeats: int,
    earlier: Collection[tuple[str, int]] = (),
    per_workload: int = INTERPOLATION_PER_WORKLOAD,
) -> Drawn:
    """The cells of a new set for `workloads` (ones the model knows, not recorded), and in
    words what could not be drawn."""
    drawn = Drawn()
    for wl in workloads:
        excluded = {
            *model.sizes[wl.name],
            *wl.sizes,
            *wl.held_out,
            *(s for w, s in earlier if w == wl.name),
        }
        sizes, why = _interpolation(model, wl, seed, excluded, per_workload)
        drawn.cells += [{"workload": wl.name, "size": s, "kind": "interpolation"} for s in sizes]
        if why:
            drawn.absent.append({"kind": "interpolation", "workload": wl.name, "reason": why})
        cell, why = _extrapolation(
            model, wl, seed, excluded | set(sizes), machine, repeats, truth_repeats
        )
        if cell is not None:
            drawn.cells.append(cell)
        if why:
            drawn.absent.append({"kind": "extrapolation", "workload": wl.name, "reason": why})
    for kind, (cell, why) in (
        ("unseen_kernel", _unseen_kernel(model, seed, machine, repeats, truth_repeats)),
        ("unseen_device", _unseen_device(model, seed)),
    ):
        if cell is not None:
            drawn.cells.append(cell)
        if why:
            drawn.absent.append({"kind": kind, "reason": why})
    return drawn


def document_for(
    model: Model,
    drawn: Drawn,
    *,
    seed: int,
    repeats: int,
    truth_repeats: int,
    workloads: Sequence[str],
    code: Mapping[str, Any] | None = None,
    created_at: str | None = None,
) -> dict[str, Any]:
    document: dict[str, Any] = {
        "format": FORMAT,
        "created_at": created_at or dt.datetime.now(dt.UTC).isoformat(timespec="microseconds"),
        "model": {
            "version": model.version,
            "device_id": model.device_id,
            "trained_at": model.trained_at,
            "trained_sizes": {w: sorted(model.sizes[w]) for w in sorted(model.sizes)},
        },
        "code": dict(code if code is not None else code_version()),
        "seed": seed,
        "profile": {"repeats": repeats, "truth_repeats": truth_repeats},
        "workloads": list(workloads),
        "cells": drawn.cells,
        "absent": drawn.absent,
    }
    document["sha256"] = digest(document)
    return document


def write(home: Path, document: Mapping[str, Any]) -> Path:
    """The set's file, created once (never overwritten), read-only."""
    folder = frozen_dir(home)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{document['sha256'][:12]}.json"
    data = orjson.dumps(dict(document), option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    with os.fdopen(fd, "wb") as out:
        out.write(data + b"\n")
    return path


# --- finding and verifying a set ---------------------------------------------------------


def listed(home: Path) -> list[tuple[Path, Any]]:
    """Every set file of `home` with its parsed content (None where it does not parse), the
    newest first (by its created_at; a file that does not parse, by its modification time)."""
    found = []
    for path in frozen_dir(home).glob("*.json"):
        try:
            document: Any = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            document = None
        when = document.get("created_at") if isinstance(document, dict) else None
        if not isinstance(when, str):
            when = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).isoformat()
        found.append((when, path, document))
    found.sort(key=lambda t: (t[0], t[1].name), reverse=True)
    return [(path, document) for _, path, document in found]


def find(home: Path, selector: str | None) -> Path:
    """The set `selector` names (a path, or a prefix of its SHA-256), else the newest."""
    if selector:
        given = Path(selector).expanduser()
        if given.is_file():
            return given
        prefix = selector.lower()
        if not all(ch in "0123456789abcdef" for ch in prefix):
            raise FrozenSetError(f"--set {selector}: no such file, and not a SHA-256 prefix")
        hits = []
        for path, document in listed(home):
            sha = document.get("sha256") if isinstance(document, dict) else None
            if (isinstance(sha, str) and sha.startswith(prefix)) or path.stem.startswith(prefix):
                hits.append(path)
        if not hits:
            raise FrozenSetError(
                f"--set {selector}: no frozen set in {frozen_dir(home)} has a SHA-256 starting "
                "with it; `hpc-ds1 evaluate --freeze` writes one"
            )
        if len(hits) > 1:
            raise FrozenSetError(
                f"--set {selector}: {len(hits)} frozen sets match ("
                + ", ".join(p.stem for p in hits)
                + "); give more of the SHA-256"
            )
        return hits[0]
    sets = listed(home)
    if not sets:
        raise FrozenSetError(
            f"no frozen test set in {frozen_dir(home)}: run `hpc-ds1 evaluate --freeze` first "
            "(it draws the cells before anything is measured), then `hpc-ds1 evaluate --final`"
        )
    return sets[0][0]


def load_verified(path: Path) -> dict[str, Any]:
    """The set in `path`, after checking that it verifies against its own SHA-256 (EditedSet
    where it does not: an edited or damaged file)."""
    try:
        document = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as error:
        raise EditedSet(f"{path}: not a readable frozen set ({error})") from None
    if not isinstance(document, dict) or not isinstance(document.get("sha256"), str):
        raise EditedSet(f"{path}: not a frozen set (no sha256 field)")
    if document.get("format") != FORMAT:
        raise FrozenSetError(
            f"{path}: format {document.get('format')!r}; this version reads format {FORMAT}"
        )
    actual = digest(document)
    if actual != document["sha256"]:
        raise EditedSet(
            f"{path}: the file was edited after it was frozen: its content hashes to "
            f"{actual[:12]}…, not the {document['sha256'][:12]}… it was frozen with. A frozen "
            "set is not changed; freeze a new one with `hpc-ds1 evaluate --freeze`"
        )
    if re.fullmatch(r"[0-9a-f]{12}", path.stem) and path.stem != actual[:12]:
        raise EditedSet(f"{path}: its name does not match its SHA-256, which starts {actual[:12]}")
    return dict(document)


def check_model(document: Mapping[str, Any], model: Model) -> None:
    frozen_for = document.get("model") or {}
    if frozen_for.get("version") != model.version or frozen_for.get("device_id") != (
        model.device_id
    ):
        raise FrozenSetError(
            f"set {document['sha256'][:12]} was frozen for model {frozen_for.get('version')} on "
            f"device {frozen_for.get('device_id')}; this home's model is {model.version} on "
            f"device {model.device_id}. A set is measured with the model it was frozen for: "
            "freeze a new set for this model with `hpc-ds1 evaluate --freeze`"
        )
    unknown = sorted(
        {
            c["workload"]
            for c in document.get("cells", ())
            if c["kind"] in MEASURED_KINDS and c["workload"] not in model.workloads
        }
    )
    if unknown:  # cannot happen with the version checked; a guard against a hand-made file
        raise FrozenSetError(f"the set's cells name workloads the model never saw: {unknown}")


def marker(path: Path) -> Path:
    """`<name>.measured` beside the set: present once a measured `--final` of it started."""
    return path.with_suffix(".measured")


def measured_message(path: Path) -> str:
    try:
        info = orjson.loads(marker(path).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        info = {}
    when = info.get("claimed_at", "an earlier run")
    if info.get("evaluation_id"):
        what = f"measured by `evaluate --final` on {when} (evaluation {info['evaluation_id']})"
    else:
        what = (
            f"claimed by a measured `evaluate --final` that started on {when} and did not "
            "finish; a run that stopped midway still counts as measured, since it may have "
            "looked at part of the set"
        )
    return (
        f"frozen set {path.stem} was {what}: a set is measured once. Freeze a new set for the "
        "next headline (`hpc-ds1 evaluate --freeze`), or re-score what was measured with "
        "`hpc-ds1 evaluate --final --no-measure`"
    )


def claim(path: Path, details: Mapping[str, Any]) -> Path:
    """Mark the set as measured before anything is measured (O_EXCL: one run wins)."""
    where = marker(path)
    body = {
        "claimed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        **details,
    }
    try:
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise FrozenSetError(measured_message(path)) from None
    with os.fdopen(fd, "wb") as out:
        out.write(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
    return where


def finished(path: Path, evaluation_id: str) -> None:
    """The claim, completed with the evaluation that measured the set."""
    where = marker(path)
    try:
        body = orjson.loads(where.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        body = {}
    body.update(
        evaluation_id=evaluation_id,
        finished_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    partial = where.with_suffix(".measured.partial")
    partial.write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n")
    partial.replace(where)


def sizes_by_workload(document: Mapping[str, Any]) -> dict[str, list[int]]:
    """The sizes measured through the held-out path: interpolation and extrapolation."""
    out: dict[str, list[int]] = {}
    for cell in document["cells"]:
        if cell["kind"] in MEASURED_KINDS:
            out.setdefault(cell["workload"], []).append(int(cell["size"]))
    return {w: sorted(s) for w, s in out.items()}


def cells_of(document: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    return [c for c in document["cells"] if c["kind"] == kind]


def measured_built_in(cell: Mapping[str, Any]) -> bool:
    """Whether `--final` measures an unseen kernel's configurations: a built-in workload's (a
    user's TOML command or plug-in is decided on, not run)."""
    return cell.get("source") == "built-in"


# --- what --final reports beyond the evaluation ------------------------------------------


def by_kind(
    document: Mapping[str, Any], sessions: Sequence[Any], checks: Sequence[Any]
) -> dict[str, Any]:
    """The sessions of the interpolation cells and of the extrapolation cells apart, each a
    session table as the evaluation's, with how many of their decisions the guard flagged."""
    from .run import session_table

    out = {}
    for kind in MEASURED_KINDS:
        keys = {(c["workload"], int(c["size"])) for c in cells_of(document, kind)}
        mine = [o for o in sessions if (o.workload, o.size) in keys]
        decided = [c for c in checks if (c.workload, c.size) in keys]
        out[kind] = {
            "cells": sorted(f"{w} {s}" for w, s in keys),
            "table": session_table(mine),
            "decisions": len(decided),
            "flagged_by_guard": sum(c.flagged for c in decided),
            "modes": {
                m: sum(c.mode == m for c in decided) for m in ("auto", "confirm", "escalate")
            },
        }
    return out


def _guard_reasons(reasons: Iterable[str]) -> list[str]:
    return [r for r in reasons if not r.startswith("confidence ")]


def _pick(model: Model, workload: str, size: int, thresholds: Thresholds) -> dict[str, Any]:
    rec = model.recommend(workload, size, thresholds=thresholds)
    guard = _guard_reasons(rec.reasons)
    return {
        "config": rec.config.label(),
        "mode": rec.mode,
        "confidence": round(rec.confidence, 4),
        "reasons": list(rec.reasons),
        "flagged": bool(guard),
        "_config": rec.config,
    }


def unseen_kernel_result(
    model: Model,
    cell: Mapping[str, Any],
    observed: Sequence[Measurement],
    truth: Sequence[Measurement],
    thresholds: Thresholds,
) -> dict[str, Any]:
    """System 1's pick on the never-seen kernel and whether the guard flagged it; where its
    configurations were measured, the pick scored against the best measured (on the truth pass
    where it measured every configuration, else the observed pass) and every measured state
    decided once (dc.check_cell), with how many of those decisions the guard flagged."""
    from . import decisions as dc
    from .landscape import build_cells

    workload, size = cell["workload"], int(cell["size"])
    out: dict[str, Any] = {"workload": workload, "size": size, "source": cell.get("source")}
    try:
        pick = _pick(model, workload, size, thresholds)
    except Exception as error:  # a kernel the model cannot describe: no pick, say why
        return {**out, "scored": False, "flagged": True, "reason": f"no pick: {error}"}
    config = pick.pop("_config")
    out["system1"] = pick
    out["flagged"] = pick["flagged"]
    mine = [m for m in observed if m.held_out and (m.workload, m.size) == (workload, size)]
    cells: list[Any] = []
    for name, rows in (("truth pass", truth), ("observed pass", mine)):
        rows = [m for m in rows if (m.workload, m.size) == (workload, size)]
        cells, _ = build_cells(rows, model.space_for) if rows else ([], [])
        if cells:
            out["scored_on"] = name
            break
    if not cells:
        out["scored"] = False
        out["reason"] = (
            "its configurations were not measured"
            if measured_built_in(cell)
            else "not a built-in workload: decided on, not run"
        )
        return out
    landscape = cells[0]
    out["scored"] = True
    pick["pct_of_best"] = round(landscape.pct_of_best(config), 2)
    checks = dc.check_cell(model, landscape, model.space_for, thresholds)
    out["decisions"] = {
        "states": len(checks),
        "flagged_by_guard": sum(c.flagged for c in checks),
        "modes": {m: sum(c.mode == m for c in checks) for m in ("auto", "confirm", "escalate")},
        "best_move_share": round(sum(c.right for c in checks) / len(checks), 4) if checks else None,
    }
    return out


def unseen_device_result(
    model: Model, cell: Mapping[str, Any], thresholds: Thresholds
) -> dict[str, Any]:
    """System 1's pick for the never-seen recorded device, scored against the recorded file's
    optimum (the lowest mean over its repeats) where the model gives one the file holds."""
    from hpc_ds1.knobs import KnobError
    from hpc_ds1.workloads import UnknownWorkload, get_workload
    from hpc_ds1.workloads.recorded import RecordedWorkload

    workload, size = cell["workload"], int(cell["size"])
    out: dict[str, Any] = {"workload": workload, "device": cell.get("device")}
    try:
        wl = get_workload(workload)
    except UnknownWorkload:
        return {**out, "scored": False, "reason": "no longer registered in this home"}
    if not isinstance(wl, RecordedWorkload):
        return {**out, "scored": False, "reason": "no longer a recorded workload"}
    try:
        pick = _pick(model, workload, size, thresholds)
    except Exception as error:
        return {**out, "scored": False, "flagged": True, "reason": f"no pick: {error}"}
    config = pick.pop("_config")
    out["system1"] = pick
    out["flagged"] = pick["flagged"]
    landscape = wl.landscape()
    best_config, best_s = landscape.optimum()
    out["optimum"] = {"config": landscape.label(best_config), "mean_s": best_s}
    try:
        mean = landscape.mean(landscape.space.config(dict(config.knobs)))
    except (KnobError, KeyError, ValueError) as error:
        return {**out, "scored": False, "reason": f"its pick is not in the recorded file: {error}"}
    out["scored"] = True
    pick["mean_s"] = mean
    pick["pct_of_optimum"] = 0.0 if not mean else round(100.0 * best_s / mean, 2)
    if not mean:
        pick["note"] = "the pick failed where it was recorded"
    return out


def unseen(
    model: Model,
    document: Mapping[str, Any],
    observed: Sequence[Measurement],
    truth: Sequence[Measurement],
    thresholds: Thresholds,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for cell in document["cells"]:
        if cell["kind"] == "unseen_kernel":
            out["unseen_kernel"] = unseen_kernel_result(model, cell, observed, truth, thresholds)
        elif cell["kind"] == "unseen_device":
            out["unseen_device"] = unseen_device_result(model, cell, thresholds)
    for entry in document.get("absent", ()):
        if entry["kind"] in ("unseen_kernel", "unseen_device"):
            out[entry["kind"]] = {"absent": entry["reason"]}
    return out


def summary(
    path: Path, document: Mapping[str, Any], *, rescore: bool, claimed: Path | None
) -> dict[str, Any]:
    """What the published results say of the set (results["frozen_set"])."""
    return {
        "sha256": document["sha256"],
        "file": str(path),
        "created_at": document["created_at"],
        "code": document["code"],
        "seed": document["seed"],
        "cells": document["cells"],
        "absent": document["absent"],
        "rescore": rescore,
        "measured_marker": str(claimed) if claimed else None,
        "what": (
            "a re-score of what the set's measured run measured (--no-measure): nothing was "
            "measured now"
            if rescore
            else "the set's one measured run"
        ),
    }


def render(results: Mapping[str, Any]) -> str:
    frozen = results.get("frozen_set")
    if not frozen:
        return ""
    lines = [
        "",
        f"Frozen set {frozen['sha256']}"
        + (" (re-score, nothing measured now)" if frozen["rescore"] else " (measured once)"),
        f"  {len(frozen['cells'])} cells, seed {frozen['seed']}, frozen {frozen['created_at']}",
    ]
    for kind in MEASURED_KINDS:
        part = results.get("by_kind", {}).get(kind)
        if not part:
            continue
        lines.append(
            f"  {kind}: {', '.join(part['cells']) or 'none'} · {part['flagged_by_guard']} of "
            f"{part['decisions']} decisions flagged by the guard"
        )
        for row in part["table"]:
            lines.append(
                f"    {row['policy']:22} median {row['pct_median']:6.2f}  p10 "
                f"{row['pct_p10']:6.2f}  runs {row['runs_median']} (max {row['runs_max']})"
            )
    for kind, part in results.get("unseen", {}).items():
        if "absent" in part:
            lines.append(f"  {kind}: none · {part['absent']}")
            continue
        pick = part.get("system1") or {}
        what = f"  {kind}: {part['workload']}"
        if kind == "unseen_device" and part.get("device"):
            what += f" ({part['device']})"
        what += f" · System 1 {pick.get('config', '-')} {pick.get('mode', '')}, " + (
            "flagged by the guard" if part.get("flagged") else "NOT flagged by the guard"
        )
        score = pick.get("pct_of_best", pick.get("pct_of_optimum"))
        if part.get("scored"):
            what += f" · {score:.2f} % of the best"
            if part.get("scored_on"):
                what += f" ({part['scored_on']})"
        else:
            what += f" · not scored: {part.get('reason', '')}"
        lines.append(what)
        decisions = part.get("decisions")
        if decisions:
            lines.append(
                f"    {decisions['states']} states decided: {decisions['flagged_by_guard']} "
                f"flagged by the guard, modes {decisions['modes']}"
            )
    return "\n".join(lines)
