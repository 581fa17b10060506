"""The workload registry: built-ins, `register()` calls and the `hpc_ds1.workloads` entry points."""

from __future__ import annotations

import importlib
import threading
from importlib.metadata import entry_points

from hpc_ds1.workloads.base import Workload

ENTRY_POINT_GROUP = "hpc_ds1.workloads"
BUILTIN_MODULES = (
    "hpc_ds1.workloads.gemm",
    "hpc_ds1.workloads.stencil",
    "hpc_ds1.workloads.nbody",
    "hpc_ds1.workloads.montecarlo",
)

_lock = threading.Lock()
_registry: dict[str, Workload] = {}
_loaded = False


class UnknownWorkload(KeyError):
    """No workload of that name; the message lists the known ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown workload"


def register(workload: Workload, *, replace: bool = False) -> Workload:
    """Add a workload under its name. Registering the same object twice is a no-op."""
    if not isinstance(workload, Workload):
        raise TypeError(f"register() takes a Workload, not {type(workload).__name__}")
    with _lock:
        current = _registry.get(workload.name)
        if current is not None and current is not workload and not replace:
            raise ValueError(f"a workload named {workload.name!r} is already registered")
        _registry[workload.name] = workload
    return workload


def unregister(name: str) -> None:
    with _lock:
        _registry.pop(name, None)


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN_MODULES:
        register(importlib.import_module(module).WORKLOAD, replace=True)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        loaded = ep.load()
        workload = loaded() if callable(loaded) and not isinstance(loaded, Workload) else loaded
        if isinstance(workload, Workload) and workload.name not in _registry:
            register(workload)


def list_workloads() -> list[str]:
    _load()
    return sorted(_registry)


def get_workload(name: str) -> Workload:
    _load()
    try:
        return _registry[name]
    except KeyError:
        known = ", ".join(sorted(_registry))
        raise UnknownWorkload(f"unknown workload {name!r}; known workloads: {known}") from None


def resolve(name: str, module: str = "") -> Workload:
    """Find a workload in a fresh process: registry first, then by importing its module."""
    _load()
    if name not in _registry and module:
        mod = importlib.import_module(module)
        if name not in _registry:
            for value in vars(mod).values():
                if isinstance(value, Workload) and value.name == name:
                    register(value)
                    break
    return get_workload(name)
