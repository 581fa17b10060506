"""Package discovery: the services and migrations live beside libs/ but install inside hpc_ds1.

The dependencies: [tool.hpc-ds1]'s list in pyproject.toml plus the MPICH wheel (the `mpich`
extra), which HPC_DS1_NO_MPICH=1 at install time leaves out for a site with its own MPI:
`HPC_DS1_NO_MPICH=1 pip install .` (docs/slurm.md, "A site's MPI")."""

import os
import tomllib
from pathlib import Path

from setuptools import find_packages, setup

NO_MPICH = "HPC_DS1_NO_MPICH"


def dependencies(pyproject: dict, env: dict[str, str]) -> list[str]:
    """The install requirements: the base list, and the MPICH wheel unless `env` opts out."""
    base = list(pyproject["tool"]["hpc-ds1"]["dependencies"])
    if env.get(NO_MPICH, "").strip().lower() in ("1", "true", "yes", "on"):
        return base
    return base + list(pyproject["project"]["optional-dependencies"]["mpich"])


packages = (
    find_packages("libs")
    + ["hpc_ds1.services"]
    + [f"hpc_ds1.services.{name}" for name in find_packages("services")]
    + ["hpc_ds1.migrations", "hpc_ds1.migrations.versions"]
)

if __name__ == "__main__":
    config = tomllib.loads((Path(__file__).parent / "pyproject.toml").read_text())
    setup(packages=packages, install_requires=dependencies(config, dict(os.environ)))
