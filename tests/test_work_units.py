"""How `make pytest` splits the suite between its workers (tests/support/tiers.py)."""

from __future__ import annotations

from tests.support.tiers import SHARED_FOLDERS, work_unit


def test_a_shared_folder_is_one_unit_and_any_other_module_its_own() -> None:
    assert work_unit("tests/e2e/test_decide.py::test_x") == "tests/e2e/"
    assert work_unit("tests/e2e/test_evaluate.py::test_y[a::b]") == "tests/e2e/"
    assert work_unit("tests/slurm/test_srun.py::T::test_z") == "tests/slurm/"
    assert work_unit("tests/model/test_model.py::test_a") == "tests/model/test_model.py"
    assert work_unit("tests/test_space.py::test_b") == "tests/test_space.py"


def test_every_shared_folder_exists() -> None:
    from pathlib import Path

    root = Path(__file__).parent.parent
    assert all((root / folder).is_dir() for folder in SHARED_FOLDERS)
