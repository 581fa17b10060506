"""Generate schemas/ from the event models: `python -m hpc_ds1.events.schemas [--check] [DIR]`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .base import Envelope
from .catalog import EVENT_TYPES


def render() -> dict[str, str]:
    """File name → JSON text for the envelope and every event type."""
    files = {"envelope.json": _dump(Envelope.model_json_schema())}
    for event_type, cls in sorted(EVENT_TYPES.items()):
        schema = cls.model_json_schema()
        schema["$id"] = f"hpcds1/{event_type}/v{cls.version}"
        schema["x-subject"] = f"<prefix>.{cls.aggregate}.<{cls.id_field}>.{cls.name}"
        files[f"{event_type}.v{cls.version}.json"] = _dump(schema)
    return files


def _dump(schema: dict[str, object]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def drift(directory: Path) -> list[str]:
    """What differs between the models and the files in `directory`, one line per file."""
    expected = render()
    present = {p.name: p.read_text() for p in directory.glob("*.json")}
    problems = [f"{name}: missing" for name in expected if name not in present]
    problems += [
        f"{name}: stale" for name in expected if name in present and present[name] != expected[name]
    ]
    problems += [f"{name}: no such event" for name in present if name not in expected]
    return sorted(problems)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [a for a in argv if not a.startswith("--")]
    directory = Path(paths[0]) if paths else Path("schemas")
    if check:
        problems = drift(directory)
        for line in problems:
            print(line)
        return 1 if problems else 0
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.json"):
        old.unlink()
    for name, text in render().items():
        (directory / name).write_text(text)
    print(f"wrote {len(render())} schemas to {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
