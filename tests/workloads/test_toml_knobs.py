"""A TOML workload with knobs of its own and constraints between them (issue 42): parsed,
enumerated, moved through and run for real under MPI ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_ds1.runner import Status, run
from hpc_ds1.runner.checks import InvalidJob
from hpc_ds1.space import RANKS_UP, Config, ConfigSpace, InfeasibleConfig, neighbours
from hpc_ds1.workloads import WorkloadFileError, load_workload_file
from tests.workloads.gridapp import GRID_TOML, write_grid_toml


def _space(path: Path, cpus: int = 2) -> ConfigSpace:
    wl = load_workload_file(path)
    return ConfigSpace.for_cpus(cpus, wl.tiles, 0, knobs=wl.knobs, constraints=wl.constraints)


def test_three_knobs_and_constraints_give_the_valid_configurations(tmp_path: Path) -> None:
    wl = load_workload_file(write_grid_toml(tmp_path))
    assert [k.name for k in wl.knobs] == ["nb", "p", "q", "algo"]
    assert [k.kind for k in wl.knobs] == ["int", "int", "int", "category"]
    assert wl.constraints == ("p * q == ranks", "p <= q")
    space = _space(write_grid_toml(tmp_path))
    configs = space.configs()
    # ranks x threads <= 4 on 2 CPUs; p * q == ranks, p <= q: (1,1,r1) (1,2,r2) (2,2,r4)
    assert len(configs) == (2 + 2 + 1) * 2 * 2
    for c in configs:
        assert c.knob("p") * c.knob("q") == c.ranks and c.knob("p") <= c.knob("q")  # type: ignore[operator]
        assert c.tile == 1 and not c.gpu
    default = space.default()
    assert dict(default.knobs) == {"nb": 8, "p": 1, "q": 1, "algo": "pairwise"}


def test_moves_keep_the_constraints_and_a_locked_knob_brings_the_others_along(
    tmp_path: Path,
) -> None:
    space = _space(write_grid_toml(tmp_path))
    start = Config(
        ranks=1, threads=1, tile=1, knobs={"nb": 8, "p": 1, "q": 1, "algo": "sequential"}
    )
    moves = neighbours(start, space)
    assert set(moves) == {RANKS_UP, "THREADS_UP", "nb+", "p+", "q+", "algo=pairwise"}
    # p=2 alone breaks both constraints: the grid becomes 2 x 2 and the ranks 4
    assert moves["p+"] == Config(
        ranks=4, threads=1, tile=1, knobs={"nb": 8, "p": 2, "q": 2, "algo": "sequential"}
    )
    # one more rank needs a grid that holds it: q goes along (p <= q keeps p at 1)
    assert moves[RANKS_UP] == Config(
        ranks=2, threads=1, tile=1, knobs={"nb": 8, "p": 1, "q": 2, "algo": "sequential"}
    )
    assert moves["algo=pairwise"].knob("algo") == "pairwise"
    for target in moves.values():
        assert space.contains(target)


def test_a_configuration_outside_the_constraints_or_without_its_knobs_is_refused_in_words(
    tmp_path: Path,
) -> None:
    space = _space(write_grid_toml(tmp_path))
    wrong = Config(ranks=2, threads=1, tile=1, knobs={"nb": 8, "p": 2, "q": 1, "algo": "pairwise"})
    with pytest.raises(InfeasibleConfig, match=r"nb=8 p=2 q=1 algo=pairwise violates 'p <= q'$"):
        space.validate(wrong)
    assert space.problem(Config(ranks=1, threads=1, tile=1)) == (
        "knobs nb, p, q, algo missing: this workload's configurations give each of its knobs "
        "nb, p, q, algo"
    )
    unknown = Config(
        ranks=1, threads=1, tile=1, knobs={"nb": 8, "p": 1, "q": 1, "algo": "pairwise", "x": 1}
    )
    assert "knobs x unknown" in (space.problem(unknown) or "")
    odd = Config(ranks=1, threads=1, tile=1, knobs={"nb": 16, "p": 1, "q": 1, "algo": "pairwise"})
    assert space.problem(odd) == "nb=16 is not accepted; nb must be one of [8, 32]"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            'constraints = ["p * q == ranks", "p <= q"]',
            'constraints = ["p * q == nodes"]',
            "[workload] constraints[0]: constraint 'p * q == nodes': unknown name 'nodes'",
        ),
        (
            'constraints = ["p * q == ranks", "p <= q"]',
            'constraints = "p * q == ranks"',
            "[workload] constraints: must be a list of expressions",
        ),
        (
            'constraints = ["p * q == ranks", "p <= q"]',
            "constraints = [\"__import__('os')\"]",
            "[workload] constraints[0]",
        ),
        ("p = [1, 2]", "p = [1, 2, 2]", "[knobs.p] values: [1, 2, 2] repeats a value"),
        ("nb = [8, 32]", "nb = {{ range = [8, 4] }}", "[knobs.nb] range"),
        ("nb = [8, 32]", "size = [8, 32]", "[knobs.size]: 'size' is not accepted as a name"),
    ],
)
def test_bad_knobs_and_constraints_name_the_file_and_the_field(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    assert old in GRID_TOML
    path = write_grid_toml(tmp_path, text=GRID_TOML.replace(old, new))
    with pytest.raises(WorkloadFileError) as caught:
        load_workload_file(path)
    assert str(caught.value).startswith(f"{path}: "), caught.value
    assert message in str(caught.value), caught.value


def test_constraints_without_knobs_are_refused(tmp_path: Path) -> None:
    text = GRID_TOML.split("[knobs]")[0].replace(
        "--nb {{nb}} --p {{p}} --q {{q}} --algo {{algo}}", ""
    )
    text += "[check]\nexit_code = true\n"
    path = write_grid_toml(tmp_path, text=text)
    with pytest.raises(WorkloadFileError, match="constrain knobs: declare them under"):
        load_workload_file(path)


def test_the_knobs_run_for_real_under_two_mpi_ranks(tmp_path: Path) -> None:
    wl = load_workload_file(write_grid_toml(tmp_path))
    config = Config(
        ranks=2, threads=1, tile=1, knobs={"nb": 32, "p": 1, "q": 2, "algo": "pairwise"}
    )
    result = run(wl, 256, config, repeats=2, space=_space(write_grid_toml(tmp_path)))
    assert result.status is Status.OK, result.error
    assert result.check_ok and result.runtime_s is not None and result.runtime_s > 0
    assert " -n 2 " in result.command
    assert result.command.endswith("gridapp.py --n 256 --nb 32 --p 1 --q 2 --algo pairwise")
    assert result.config == config
    # a grid that does not hold the ranks is refused before anything runs
    wrong = Config(ranks=2, threads=1, tile=1, knobs={"nb": 32, "p": 1, "q": 1, "algo": "pairwise"})
    with pytest.raises(InvalidJob, match=r"algo=pairwise violates 'p \* q == ranks'$"):
        run(wl, 256, wrong, repeats=1, space=_space(write_grid_toml(tmp_path)))
