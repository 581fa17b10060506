"""What several commands share: settings from the environment plus flags, and logging."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from .. import log
from ..settings import Settings
from . import UsageError


def load_settings(**overrides: Any) -> Settings:
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as error:
        problems = "; ".join(
            f"HPC_DS1_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
            for e in error.errors()
        )
        raise UsageError(f"invalid settings: {problems}") from None
    log.configure(settings.log_level, settings.log_json)
    return settings


def add_home_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", help="data folder (default $HPC_DS1_HOME or ~/.hpc_ds1)")
