"""The console ships in the package: every file of libs/hpc_ds1/console (templates, static
files, vendored ones) is named by the package-data patterns of pyproject.toml, so `pip install
.` (a wheel, not only this editable checkout) serves the same page."""

from __future__ import annotations

import tomllib
from pathlib import Path

from hpc_ds1.console import PACKAGE_DIR, SECTIONS, STATIC_DIR, TEMPLATES_DIR

REPO = Path(__file__).resolve().parents[2]


def shipped() -> set[Path]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["hpc_ds1.console"]
    found: set[Path] = set()
    for pattern in patterns:
        found |= {p for p in PACKAGE_DIR.glob(pattern) if p.is_file()}
    return found


def test_every_console_file_is_package_data() -> None:
    files = {
        p
        for p in PACKAGE_DIR.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    }
    missing = sorted(str(p.relative_to(PACKAGE_DIR)) for p in files - shipped())
    assert not missing, f"add patterns for these to pyproject.toml package-data: {missing}"


def test_the_shell_and_every_section_template_are_there() -> None:
    for name in ("index.html", "base.html", "signin.html"):
        assert (TEMPLATES_DIR / name).is_file()
    index = (TEMPLATES_DIR / "index.html").read_text()
    includes = [f'{{% include "sections/{stem}.html" %}}' for stem, _, _ in SECTIONS]
    positions = [index.index(line) for line in includes]
    assert positions == sorted(positions)  # in the seed's order
    for stem, _, _ in SECTIONS:
        assert (TEMPLATES_DIR / "sections" / f"{stem}.html").is_file()
    assert (STATIC_DIR / "console.js").is_file() and (STATIC_DIR / "console.css").is_file()
    assert shipped() >= {STATIC_DIR / "console.js", TEMPLATES_DIR / "index.html"}
