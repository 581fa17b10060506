"""The compact `--job` form that carries one job on the rank program's command line."""

from __future__ import annotations

from dataclasses import dataclass


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

    def encode(self) -> str:
        text = (
            f"workload={self.workload},size={self.size},threads={self.threads},"
            f"tile={self.tile},repeats={self.repeats},gpu={int(self.gpu)}"
        )
        text += f",block={self.block}" if self.block else ""
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
            )
        except (KeyError, ValueError) as error:
            raise ValueError(f"bad --job {text!r}: {error}") from None
