"""An upgrade that loses nothing (issue 46, item 4): the previous release (CHANGELOG.md's latest
tagged version, its source taken from git) serves a home and builds it for real (a setup and
its trained model, a decision, a tuning session left waiting for an engineer, a fleet task);
then this code serves the same home, through its migrations, and every earlier decision,
session and task reads the same from the API, the audit file verifies, the old model still
recommends and a new decision is made beside the old ones."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpc_ds1.infra.ports import free_port
from tests.support.commands import HPC_DS1
from tests.support.serving import cli_headers, start_serve, stop, wait_ready

REPO = Path(__file__).resolve().parents[2]
RELEASE = re.compile(r"^## (v\d+\.\d+\.\d+) .*\(commit ([0-9a-f]{40})\)", re.MULTILINE)
OLD_CLI = (sys.executable, "-c", "import sys; from hpc_ds1.cli import main; sys.exit(main())")
SIZE = 192


def previous_release() -> tuple[str, str]:
    """(version, commit) of the newest release CHANGELOG.md names."""
    found = RELEASE.search((REPO / "CHANGELOG.md").read_text())
    assert found, "CHANGELOG.md names no release as '## vX.Y.Z … (commit <40 hex>)'"
    return found.group(1), found.group(2)


def release_tree(commit: str, into: Path) -> Path:
    """The release's package as an install lays it out (setup.py: services and migrations
    inside hpc_ds1), from git, for PYTHONPATH: the folder to put first on it."""
    archive = subprocess.run(
        [
            "git",
            "-C",
            str(REPO),
            "archive",
            "--format=tar",
            commit,
            "libs",
            "services",
            "migrations",
        ],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        pytest.fail(
            f"the previous release's commit {commit} is not in this clone (a shallow clone?): "
            f"{archive.stderr.decode()[:300]}"
        )
    source = into / "source"
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(source, filter="data")
    root = into / "root"
    shutil.copytree(source / "libs" / "hpc_ds1", root / "hpc_ds1")
    shutil.copytree(source / "services", root / "hpc_ds1" / "services")
    shutil.copytree(source / "migrations", root / "hpc_ds1" / "migrations")
    return root


def run(
    command: tuple[str, ...], env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done


def api(url: str, home: Path, path: str) -> Any:
    reply = httpx.get(f"{url}{path}", headers=cli_headers(home), timeout=30)
    assert reply.status_code == 200, f"{path}: {reply.status_code} {reply.text}"
    return reply.json()


def test_this_code_serves_a_home_the_previous_release_built(tmp_path: Path) -> None:
    version, commit = previous_release()
    root = release_tree(commit, tmp_path / "release")
    home = tmp_path / "home"
    base = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    base["HPC_DS1_HOME"] = str(home)
    old = {**base, "PYTHONPATH": str(root)}
    imported = subprocess.run(
        [sys.executable, "-c", "import hpc_ds1; print(hpc_ds1.__file__)"],
        env=old,
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip().startswith(str(root)), imported.stdout  # the release's code

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serving = start_serve(home, port, OLD_CLI, PYTHONPATH=str(root))
    try:
        wait_ready(url, serving, timeout=300)
        run(OLD_CLI, old, "setup", "--workload", "gemm", "--sizes", "128,192", "--json")
        decided = json.loads(
            run(
                OLD_CLI,
                old,
                *f"decide --workload gemm --size {SIZE} --ranks 1 --threads 1".split(),
                "--runtime-s",
                "0.05",
                "--json",
            ).stdout
        )
        session = json.loads(
            run(
                OLD_CLI, old, *f"tune --workload gemm --size {SIZE} --no-wait --json".split()
            ).stdout
        )
        task = json.loads(
            run(OLD_CLI, old, *f"submit --workload gemm --size {SIZE} --json".split()).stdout
        )
        before = {
            "decisions": api(url, home, "/v1/audit?limit=500")["decisions"],
            "session": api(url, home, f"/v1/sessions/{session['session_id']}"),
            "task": api(url, home, f"/v1/tasks/{task['task_id']}"),
        }
    finally:
        stop(serving)
    assert decided["decision_id"] in {d["decision_id"] for d in before["decisions"]}

    serving = start_serve(home, port)
    try:
        wait_ready(url, serving, timeout=300)
        after = {
            "decisions": api(url, home, "/v1/audit?limit=500")["decisions"],
            "session": api(url, home, f"/v1/sessions/{session['session_id']}"),
            "task": api(url, home, f"/v1/tasks/{task['task_id']}"),
        }
        for key in ("decisions", "task"):
            assert _common(before[key], after[key]) == before[key], f"{key} changed ({version})"
        # The session goes on under the new coordinator (its auto moves run): what it was
        # started as stays, and it has not gone back.
        fixed = ("session_id", "device_id", "workload", "size", "start", "owner", "started_at")
        assert {k: after["session"][k] for k in fixed} == {k: before["session"][k] for k in fixed}
        assert after["session"]["real_runs"] >= before["session"]["real_runs"]
        old_steps = before["session"]["events"]
        assert _common(old_steps, after["session"]["events"][: len(old_steps)]) == old_steps
        now = subprocess.run(
            [HPC_DS1, "audit", "verify"], env=base, capture_output=True, text=True, timeout=300
        )
        assert now.returncode == 0 and "intact" in now.stdout, now.stdout + now.stderr
        run((HPC_DS1,), base, *f"recommend --workload gemm --size {SIZE}".split())
        fresh = json.loads(
            run(
                (HPC_DS1,),
                base,
                *f"decide --workload gemm --size {SIZE} --ranks 1 --threads 1".split(),
                "--runtime-s",
                "0.05",
                "--json",
            ).stdout
        )
        listed = {d["decision_id"] for d in api(url, home, "/v1/audit?limit=500")["decisions"]}
        assert {fresh["decision_id"], decided["decision_id"]} <= listed
    finally:
        stop(serving)


def _common(old: Any, new: Any) -> Any:
    """`new` cut down to the fields `old` has (a newer release may add fields, never drop or
    change one): lists item by item, objects key by key."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {k: _common(v, new.get(k)) for k, v in old.items()}
    if isinstance(old, list) and isinstance(new, list):
        return [_common(o, n) for o, n in zip(old, new, strict=False)]
    return new
