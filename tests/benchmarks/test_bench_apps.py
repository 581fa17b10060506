"""benchmarks/bench_apps.py in small (CI's version): hpcc at its smallest size, every
configuration of its space measured for real, `setup --budget 4` into a fresh home, one tuning
session from the default start, and its end measured against the exhaustive best once more.
The report's structure and invariants are checked, never a timing or the verdict (a real run
on a shared machine; the figures are in docs/performance.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import bench_apps

pytestmark = [
    pytest.mark.e2e,  # real hpcc runs under Open MPI, as tests/apps/ (some three minutes here)
    pytest.mark.skipif(
        shutil.which("hpcc") is None or shutil.which("mpirun.openmpi") is None,
        reason="Debian's hpcc (and its Open MPI mpirun) is not installed: `make apps` as root",
    ),
]


def _holds_hpcc_constraints(config: dict[str, object]) -> bool:
    knobs = dict(config["knobs"])  # type: ignore[call-overload]
    return bool(
        knobs["p"] * knobs["q"] == config["ranks"]
        and knobs["p"] <= knobs["q"]
        and config["threads"] == 1
    )


def test_hpcc_at_its_smallest_size_against_its_exhaustive_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "apps.json"
    code = bench_apps.main(
        ["hpcc", "--sizes", "400", "--budget", "4", "--confirm", "1", "--json", str(out)]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert report["machine"]["uptime_before"] and report["machine"]["uptime_after"]
    app = report["apps"]["hpcc"]
    assert "error" not in app, app.get("error")
    assert app["sizes"] == [400] and app["budget"] == 4 and app["feasible"] is True

    # the exhaustive search: every configuration of the space once, each feasible; its best
    # is the fastest of what ran ok
    search = app["exhaustive"]["400"]
    rows = search["configs"]
    assert len(rows) == app["space_per_size"] == app["space"]
    assert len({json.dumps(r["config"], sort_keys=True) for r in rows}) == len(rows)
    assert all(_holds_hpcc_constraints(r["config"]) for r in rows)
    assert search["runs"] == sum(r["repeats"] for r in rows) >= len(rows)
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(r["runtime_s"] > 0 for r in ok)
    assert search["best"]["runtime_s"] == min(r["runtime_s"] for r in ok)

    # the budgeted setup measured its budget (a fresh home: nothing to read back)
    assert app["setup"]["measured"] == 4 and app["setup"]["model"]

    # the session started at the default start and ended on a feasible configuration
    session = app["sessions"]["400"]
    assert session["real_runs"] >= 1 and session["steps"]
    assert session["steps"][0]["config"] == app["start"]
    assert dict(app["start"]["knobs"]) == {"nb": 64, "p": 1, "q": 1}
    assert session["end"] is not None and _holds_hpcc_constraints(session["end"])
    assert session["end_runtime_s"] > 0

    # the comparison: a ratio of measured medians, the verdict read from it
    found = app["comparison"]["400"]
    assert found["ratio"] is not None and found["ratio"] >= 0
    assert found["within_5pct"] == (found["ratio"] <= bench_apps.TARGET)
    if found["same_config"]:
        assert found["ratio"] == 1.0 and session["end"] == search["best"]["config"]
    else:
        assert (
            len(found["best_runtimes_s"]) + len(found["end_runtimes_s"]) + len(found["failed"])
            == 2 * app["confirm_pairs"]
        )
        assert found["best_spread"] >= 0 and found["end_spread"] >= 0
    # where the end stood in the search's own runs: at or behind its best
    assert 1 <= found["exhaustive_rank"] <= found["exhaustive_ok"] == len(ok)
    assert found["exhaustive_ratio"] >= 1
    assert app["all_within_5pct"] == found["within_5pct"]
    assert "session end / exhaustive best per size" in capsys.readouterr().out
