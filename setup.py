"""Package discovery: the services and migrations live beside libs/ but install inside hpc_ds1."""

from setuptools import find_packages, setup

packages = (
    find_packages("libs")
    + ["hpc_ds1.services"]
    + [f"hpc_ds1.services.{name}" for name in find_packages("services")]
    + ["hpc_ds1.migrations", "hpc_ds1.migrations.versions"]
)

setup(packages=packages)
