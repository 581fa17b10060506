"""The batch job of a Slurm-partition device (fleet/slurm.py), on the node Slurm chose:

    python -m hpc_ds1.fleet.slurm_job --workload W --size N --config JSON --repeats K
        --timeout-s S --result PATH

validates the configuration against this node's space, runs it with the ranks started by `srun`
(a job step of this job's allocation) and writes {"result": RunResult} or {"refused": why} to
PATH (atomically: the agent reads it once the job has ended). Exit 0 when a result was written,
whatever its status."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def _write(path: Path, body: dict[str, object]) -> None:
    partial = path.with_name(path.name + ".part")
    partial.write_text(json.dumps(body))
    os.replace(partial, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc_ds1.fleet.slurm_job")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--size", required=True, type=int)
    parser.add_argument("--config", required=True, help="the configuration, as JSON")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--result", required=True, type=Path)
    args = parser.parse_args(argv)

    from pydantic import ValidationError

    from hpc_ds1.runner import InvalidJob, run, validate
    from hpc_ds1.space import Config, ConfigSpace

    try:
        config = Config.model_validate_json(args.config)
        space = ConfigSpace.for_device(workload=args.workload).runnable()
        validate(args.workload, args.size, config, space)
        result = run(
            args.workload,
            args.size,
            config,
            repeats=args.repeats,
            timeout_s=args.timeout_s,
            space=space,
            launcher="srun",
        )
    except (InvalidJob, ValidationError, ValueError, LookupError) as error:
        _write(args.result, {"refused": f"{type(error).__name__}: {error}"})
        return 0
    _write(args.result, {"result": result.model_dump(mode="json")})
    print(f"{result.workload} size={result.size} {result.config.label()}: {result.status.value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
