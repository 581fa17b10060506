"""The compact `--job` form that carries one job on the rank program's command line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpc_ds1.knobs import Knob, Value


@dataclass(frozen=True)
class JobSpec:
    workload: str
    size: int
    threads: int
    tile: int
    repeats: int
    gpu: bool = False
    module: str = ""
    block: int = 0
    # The workload's own knobs as text ("k.<name>=<value>"; a knob value holds no ',' nor '='),
    # read back as the workload's values on the rank (`knob_values`).
    knobs: tuple[tuple[str, str], ...] = ()

    def encode(self) -> str:
        text = (
            f"workload={self.workload},size={self.size},threads={self.threads},"
            f"tile={self.tile},repeats={self.repeats},gpu={int(self.gpu)}"
        )
        text += f",block={self.block}" if self.block else ""
        text += "".join(f",k.{name}={value}" for name, value in self.knobs)
        return text + (f",module={self.module}" if self.module else "")

    @classmethod
    def decode(cls, text: str) -> JobSpec:
        fields = dict(part.split("=", 1) for part in text.split(",") if part)
        try:
            return cls(
                workload=fields["workload"],
                size=int(fields["size"]),
                threads=int(fields["threads"]),
                tile=int(fields["tile"]),
                repeats=int(fields.get("repeats", "3")),
                gpu=fields.get("gpu", "0") in ("1", "true", "True"),
                module=fields.get("module", ""),
                block=int(fields.get("block", "0")),
                knobs=tuple((k[2:], v) for k, v in fields.items() if k.startswith("k.")),
            )
        except (KeyError, ValueError) as error:
            raise ValueError(f"bad --job {text!r}: {error}") from None


def knob_text(value: object) -> str:
    """A knob value as the job line carries it (a bool as true/false, as TOML writes it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def knob_values(spec: JobSpec, knobs: tuple[Knob, ...]) -> dict[str, Value]:
    """The job line's knob texts as the workload's own values (ValueError naming one that is
    not among a knob's values)."""
    texts = dict(spec.knobs)
    out: dict[str, Value] = {}
    for knob in knobs:
        name, values = knob.name, knob.values
        if name not in texts:
            raise ValueError(f"the job gives no value for knob {name}")
        found = [v for v in values if knob_text(v) == texts[name]]
        if not found:
            raise ValueError(f"knob {name}={texts[name]!r} is not one of {list(values)}")
        out[name] = found[0]
    return out
