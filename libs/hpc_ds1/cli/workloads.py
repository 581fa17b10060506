"""`hpc-ds1 workloads`: every workload this home can run, where each comes from, and the plug-ins
or workload files that could not be loaded (with why); `--check FILE` validates a TOML file."""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import UsageError
from .common import add_home_argument, add_json_argument, load_settings


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "workloads",
        help="list the workloads (built-ins, plug-ins, TOML files) and the files refused",
        description="List every workload this home can run, or check a TOML workload file "
        "(docs/plugins.md).",
    )
    parser.add_argument(
        "--check",
        metavar="FILE",
        help="validate this TOML workload file, show what it declares and what it needs that "
        "is missing here (exit status 1 then)",
    )
    add_json_argument(parser, "the list (or the checked file's workload)")
    add_home_argument(parser)
    parser.set_defaults(handler=handle)


def describe(workload: Any, source: str) -> dict[str, Any]:
    from hpc_ds1.workloads import CommandWorkload

    out: dict[str, Any] = {
        "name": workload.name,
        "source": source,
        "description": workload.description,
        "sizes": list(workload.sizes),
        "held_out": list(workload.held_out),
        "tile": {"name": "tile", "values": list(workload.tiles), "default": workload.default_tile},
    }
    if workload.has_block:
        out["block"] = {"values": list(workload.blocks), "default": workload.default_block}
    if workload.knobs:
        out["knobs"] = {
            k.name: {"kind": k.kind, "values": list(k.values), "default": k.default}
            for k in workload.knobs
        }
        out["constraints"] = list(workload.constraints)
    if isinstance(workload, CommandWorkload):
        out["tile"]["name"] = workload.knob
        out["command"] = workload.template
        out["launcher"] = workload.launcher
        out["check"] = workload.check.kind
        out["runtime"] = workload.runtime.kind
        if workload.package:
            out["package"] = workload.package
        if workload.inputs or workload.output:
            out["inputs"] = [name for name, _ in workload.inputs]
            out["output"] = workload.output
        if workload.bind_knob:
            out["binding"] = workload.bind_knob  # the knob that is the launcher's rank binding
    if workload.timeout_s is not None:
        out["timeout_s"] = workload.timeout_s
    if workload.repeats is not None:
        out["repeats"] = workload.repeats
    return out


def _text(item: dict[str, Any]) -> str:
    tile = item["tile"]
    line = (
        f"{item['name']:<14} {item['source']}\n"
        f"{'':<14} sizes {item['sizes']} held out {item['held_out']} · {tile['name']} "
        f"{tile['values']} (default {tile['default']})"
    )
    if "block" in item:
        line += f" · block {item['block']['values']} (default {item['block']['default']})"
    for name, knob in item.get("knobs", {}).items():
        line += (
            f"\n{'':<14} knob {name} ({knob['kind']}) {knob['values']} (default {knob['default']})"
        )
    if item.get("constraints"):
        line += f"\n{'':<14} constraints: {' · '.join(item['constraints'])}"
    if "command" in item:
        line += (
            f"\n{'':<14} {item['launcher']} launcher: {item['command']} · check "
            f"{item['check']} · runtime {item['runtime']}"
        )
    if "output" in item:
        files = ", ".join(item["inputs"]) or "none"
        output = item["output"] or "none (its standard output)"
        line += f"\n{'':<14} each run in a fresh folder: inputs {files} · output {output}"
    if "package" in item:
        line += f"\n{'':<14} package {item['package']}"
    runs = []
    if "timeout_s" in item:
        runs.append(f"timeout {item['timeout_s']:g} s")
    if "repeats" in item:
        runs.append(f"repeats {item['repeats']}")
    if "binding" in item:
        runs.append(f"knob {item['binding']} is the launcher's rank binding")
    if runs:
        line += f"\n{'':<14} runs: {' · '.join(runs)}"
    return line


def handle(args: argparse.Namespace) -> int:
    from hpc_ds1.workloads import (
        CommandWorkload,
        WorkloadFileError,
        get_workload,
        list_workloads,
        load_errors,
        load_workload_file,
        source_of,
    )

    load_settings(quiet=True, home=args.home)
    if args.check is not None:
        try:
            found = load_workload_file(args.check)
        except WorkloadFileError as error:
            raise UsageError(str(error)) from None
        item = describe(found, found.source)
        missing: list[str] = []
        if isinstance(found, CommandWorkload):
            from hpc_ds1.runner.command import missing_programs

            missing = missing_programs(found)
            item["missing"] = missing
        if args.json:
            print(json.dumps(item, indent=2))
        else:
            print(f"valid\n{_text(item)}")
            for why in missing:
                print(f"missing here: {why}")
        return 1 if missing else 0
    items = [describe(get_workload(n), source_of(n)) for n in list_workloads()]
    errors = load_errors()
    if args.json:
        print(json.dumps({"workloads": items, "not_loaded": errors}, indent=2))
        return 0
    print("\n".join(_text(item) for item in items))
    for where, why in errors.items():
        print(f"not loaded: {why}" if why.startswith(where) else f"not loaded: {where}: {why}")
    return 0
