"""The projector: folds the event log into Postgres read models and the audit file."""

from __future__ import annotations

from hpc_ds1.eventlog.audit import AuditFile
from hpc_ds1.operations.archive import folder_of
from hpc_ds1.process.runtime import ServiceContext
from hpc_ds1.projection.rebuild import rebuild

from .projector import Projector, project

__all__ = ["Projector", "project", "rebuild", "run"]


async def run(ctx: ServiceContext) -> None:
    projector = Projector(
        ctx.engine,
        ctx.bus,
        AuditFile(ctx.settings.audit_path),
        ctx.settings.projector_batch,
        linger_s=ctx.settings.projector_linger_ms / 1000,
        archive=folder_of(ctx.settings.home),
    )
    ctx.facts["applied"] = lambda: projector.applied
    # Read by readiness: the gateway answers 503 while `healthy` is False.
    for key in ("lag", "checkpoint", "set_aside", "healthy", "problem"):
        ctx.facts[key] = lambda key=key: projector.facts()[key]
    await projector.run(ctx.stop)
