"""The fleet: devices that join over HTTP, per-device task queues and liveness, placement."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agent import Agent
    from .submission import submit

__all__ = ["Agent", "submit"]


def __getattr__(name: str) -> Any:
    # Lazy: the services import hpc_ds1.fleet.work without pulling in httpx and the agent.
    if name == "Agent":
        from .agent import Agent

        return Agent
    if name == "submit":
        from .submission import submit

        return submit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
