"""hpc_ds1.runner imports its API on first use (the rank program imports the package in every
rank of every launch); what it exports stays what its modules define."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import types

import hpc_ds1.runner as runner


def test_every_exported_name_is_its_definition_even_after_every_submodule_is_imported() -> None:
    for info in pkgutil.iter_modules(runner.__path__):
        importlib.import_module(f"{runner.__name__}.{info.name}")
    for name in runner.__all__:
        value = getattr(runner, name)
        assert not isinstance(value, types.ModuleType), name
        assert value.__module__.startswith(runner.__name__ + "."), name


def test_the_rank_programs_protocol_imports_neither_the_api_nor_pydantic() -> None:
    probe = (
        "import sys, hpc_ds1.runner.protocol, hpc_ds1.runner.jobspec; "
        "print(sorted(m for m in ('hpc_ds1.runner.api', 'pydantic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
