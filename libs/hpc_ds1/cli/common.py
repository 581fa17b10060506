"""What several commands share: settings from the environment plus flags, and logging."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import ValidationError

from .. import log
from ..settings import Settings
from . import UsageError

T = TypeVar("T")
Progress = Callable[[int, int, str], None]  # done, total, label


def load_settings(quiet: bool = False, attach: bool = True, **overrides: Any) -> Settings:
    """Settings from the environment plus flags. `quiet`: a command that shows its own output
    (a progress bar, a table) keeps the services it starts to warnings, unless
    HPC_DS1_LOG_LEVEL asks otherwise. `attach`: when a process (`hpc-ds1 serve`) owns the home,
    its stream, subject prefix and replicas (owner.json) replace this environment's; one set
    here to another value is a usage error naming both (infra.home.settings_of_owner).
    `serve` alone passes False: it becomes the owner, or is refused as a second one."""
    try:
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as error:
        problems = "; ".join(
            f"HPC_DS1_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
            for e in error.errors()
        )
        raise UsageError(f"invalid settings: {problems}") from None
    if attach:
        from ..infra.home import OwnerMismatch, attach_settings

        try:
            settings = attach_settings(settings)
        except OwnerMismatch as error:
            raise UsageError(str(error)) from None
    level = "warning" if quiet and "HPC_DS1_LOG_LEVEL" not in os.environ else settings.log_level
    log.configure(level, settings.log_json)
    from ..workloads import use_home

    use_home(settings.home)  # its workloads/*.toml: a --home is not $HPC_DS1_HOME
    return settings


def validation_message(error: ValidationError) -> str:
    """Field-level, one line: 'config.ranks: Input should be greater than or equal to 1; ...'."""
    parts = []
    for e in error.errors(include_url=False):
        where = ".".join(str(p) for p in e["loc"]) or "request"
        parts.append(f"{where}: {e['msg']}")
    return "; ".join(parts)


def add_home_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", help="data folder (default $HPC_DS1_HOME or ~/.hpc_ds1)")


def add_json_argument(parser: argparse.ArgumentParser, what: str = "the result") -> None:
    """--json: the command prints one JSON document on stdout instead of its text."""
    parser.add_argument(
        "--json", action="store_true", help=f"print {what} as JSON on stdout instead of text"
    )


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str), flush=True)


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """The command's result: `data` as JSON with --json, else `text`."""
    if getattr(args, "json", False):
        print_json(data)
    else:
        print(text, flush=True)


def show_progress() -> bool:
    """Progress bars only for a person watching: stderr is a terminal."""
    return sys.stderr.isatty()


async def with_run_progress(total: int, work: Callable[[Progress], Awaitable[T]]) -> T:
    """`work` given a progress callback (done, total, label) that drives a bar on stderr."""
    from tqdm import tqdm

    with tqdm(
        total=total,
        unit="run",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=not show_progress(),
    ) as bar:

        def progress(done: int, total: int, label: str) -> None:
            bar.set_description(label or "skipping measured")
            bar.update(done - bar.n)

        return await work(progress)


async def run_campaign(campaign: Any, chunks: Sequence[Sequence[Any]]) -> Any:
    """A measurement campaign (hpc_ds1.setup.Campaign) under a progress bar on stderr."""
    return await with_run_progress(sum(len(c) for c in chunks), lambda p: campaign.run(chunks, p))


def knob_value(text: str) -> int | float | bool | str:
    """A knob's value as written on a command line: an integer, a number, true/false, else the
    word itself (the workload's knob definition says which it accepts)."""
    word = text.strip()
    if word.lower() in ("true", "false"):
        return word.lower() == "true"
    for kind in (int, float):
        try:
            return kind(word)
        except ValueError:
            pass
    return word


def knob_assignments(pairs: list[str], option: str) -> dict[str, int | float | bool | str]:
    """NAME=VALUE pairs of a workload's own knobs (UsageError saying the accepted form)."""
    out: dict[str, int | float | bool | str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise UsageError(f"{option} {pair!r}: use NAME=VALUE, e.g. {option} nb=64")
        out[name.strip()] = knob_value(value)
    return out


def config_words(config: Mapping[str, Any], *, cpu: bool = True) -> str:
    """A recorded configuration as words: `ranks=2 threads=1 tile=64 nb=64 p=1 q=2 gpu=False`,
    the workload's own knobs flattened among them (without `gpu=False` when not `cpu`)."""
    words = []
    for key, value in config.items():
        if key == "knobs" and isinstance(value, Mapping):
            words += [f"{k}={v}" for k, v in value.items()]
        elif key != "gpu" or value or cpu:
            words.append(f"{key}={value}")
    return " ".join(words)
