"""A recorded landscape declared as a workload (issue 42, item 3): its knobs and constraints are
the file's, a run draws recorded repeats, a recorded failure fails as it failed, a configuration
not in the file is refused, and it goes through setup, decide and tune like any workload."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpc_ds1.runner import Status, run
from hpc_ds1.runner.checks import InvalidJob
from hpc_ds1.settings import Settings
from hpc_ds1.space import Config, ConfigSpace, neighbours
from hpc_ds1.workloads import WorkloadFileError, load_workload_file
from hpc_ds1.workloads.recorded_space import RecordedSpace
from tests.support.commands import run_hpc

DATA = Path(__file__).resolve().parents[1] / "tuning" / "data"
CACHE = DATA / "convolution_milo_A6000_cut.json"
KERNEL = DATA / "convolution_milo_cut.json"


def _write(folder: Path, name: str = "conv-a6000", **fields: str) -> Path:
    values = {"recorded": str(CACHE), "kernel": str(KERNEL), **fields}
    lines = [f'name = "{name}"', *(f'{k} = "{v}"' for k, v in values.items() if v)]
    path = folder / f"{name}.toml"
    path.write_text("[workload]\n" + "\n".join(lines) + "\n")
    return path


def _config(knobs: dict[str, object]) -> Config:
    return Config.model_validate({"ranks": 1, "threads": 1, "tile": 1, "knobs": knobs})


def test_its_space_is_exactly_the_recorded_configurations(tmp_path: Path) -> None:
    wl = load_workload_file(_write(tmp_path))
    landscape = RecordedSpace.load(CACHE, kernel=KERNEL)
    assert [k.name for k in wl.knobs] == list(landscape.space.names)
    assert not wl.ranks_and_threads and wl.sizes == (1,)
    space = ConfigSpace.for_device(workload=wl)
    assert space.ranks == (1,) and space.threads == (1,)
    configs = space.configs()
    assert len(configs) == landscape.count == 36
    names = landscape.space.names
    assert {tuple(c.knob(n) for n in names) for c in configs} == set(landscape.configs())
    for target in neighbours(space.default(), space).values():
        assert space.contains(target)


def test_a_run_draws_recorded_repeats_and_a_recorded_failure_fails_as_it_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPC_DS1_REPLAY_SEED", "7")
    wl = load_workload_file(_write(tmp_path))
    landscape = RecordedSpace.load(CACHE, kernel=KERNEL)
    ran = next(c for c, r in landscape.records.items() if not isinstance(r, str))
    knobs = landscape.space.as_dict(ran)
    result = run(wl, 1, _config(knobs), repeats=5)
    assert result.status is Status.OK and result.repeats == 5
    repeats = set(landscape.records[ran])  # seconds
    assert set(result.runtimes_s or ()) <= repeats
    assert result.command.startswith("replay ")
    failed = next(c for c, r in landscape.records.items() if isinstance(r, str))
    bad = run(wl, 1, _config(landscape.space.as_dict(failed)), repeats=3)
    assert bad.status is Status.FAILED
    assert bad.error == f"recorded failure: {landscape.records[failed]}"


def test_a_configuration_not_in_the_file_is_refused(tmp_path: Path) -> None:
    wl = load_workload_file(_write(tmp_path))
    space = ConfigSpace.for_device(workload=wl)
    knobs = dict(space.default().knobs)
    knobs["block_size_x"] = 48  # not a value of the recorded knob
    with pytest.raises(InvalidJob, match="block_size_x=48 is not accepted"):
        run(wl, 1, _config(knobs), repeats=1)


def test_bad_recorded_files_are_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(WorkloadFileError, match=r"\[workload\] recorded: .* is not a file"):
        load_workload_file(_write(tmp_path, recorded=str(tmp_path / "none.json")))
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2]")
    with pytest.raises(WorkloadFileError, match=r"\[workload\] recorded: .*a JSON object"):
        load_workload_file(_write(tmp_path, recorded=str(junk)))
    path = _write(tmp_path)
    path.write_text(path.read_text() + "[check]\nexit_code = true\n")
    with pytest.raises(WorkloadFileError, match="a recorded workload has only"):
        load_workload_file(path)


def test_a_recorded_gpu_is_set_up_decided_and_tuned(settings: Settings) -> None:
    folder = settings.home / "workloads"
    folder.mkdir(parents=True)
    _write(folder)

    def hpc(*args: str) -> subprocess.CompletedProcess[str]:
        return run_hpc(settings, *args, env={"HPC_DS1_REPLAY_SEED": "1"})

    setup = hpc("setup", "--workload", "conv-a6000")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "by status {'ok': 16, 'failed': 20}" in setup.stdout, setup.stdout
    decided = hpc("decide", "--workload", "conv-a6000", "--size", "1", "--ranks", "1",
                  "--threads", "1", "--json")  # fmt: skip
    assert decided.returncode == 0, decided.stdout + decided.stderr
    decision = json.loads(decided.stdout)
    assert decision["ran"] is True and len(decision["config"]["knobs"]) == 10
    tuned = hpc("tune", "--workload", "conv-a6000", "--size", "1", "--no-wait", "--json")
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    events = json.loads(tuned.stdout[tuned.stdout.index("{") :])["events"]
    landscape = RecordedSpace.load(CACHE, kernel=KERNEL)
    for e in events:
        if e["type"] == "step_run":  # every configuration a session runs is a recorded one
            config = landscape.space.config(e["data"]["config"]["knobs"])
            assert config in landscape.records
    # evaluate replays its recorded landscape (tests/evaluation/test_recorded.py has the figures)
    scored = hpc("evaluate", "--workload", "conv-a6000", "--starts", "2")
    assert scored.returncode == 0, scored.stdout + scored.stderr
    assert "in sample, nothing held out" in scored.stdout
