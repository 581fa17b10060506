"""Homes for the tests of the embedded servers."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _scratch() -> Iterator[Path]:
    # Not under pytest's basetemp: as root, Postgres runs as `pgserver` and must traverse the
    # path, and another pytest session starting meanwhile takes o+x off /tmp/pytest-of-root.
    path = Path(tempfile.mkdtemp(prefix="hpcds1-infra-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A fresh directory for a home, removed afterwards."""
    yield from _scratch()


@pytest.fixture(scope="module")
def module_scratch() -> Iterator[Path]:
    yield from _scratch()
