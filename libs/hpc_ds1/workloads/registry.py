"""The workload registry: built-ins, `register()` calls, the `hpc_ds1.workloads` entry points and
TOML workload files (discovery.py says where they are found).

A plug-in or a file never replaces a built-in, nor another's workload: the later one is refused,
and its error is kept (`load_errors()`) and shown when its name is asked for."""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

from hpc_ds1.workloads import discovery
from hpc_ds1.workloads.base import Workload
from hpc_ds1.workloads.tomlfile import WorkloadFileError, load_workload_file

ENTRY_POINT_GROUP = "hpc_ds1.workloads"
BUILTIN_MODULES = (
    "hpc_ds1.workloads.gemm",
    "hpc_ds1.workloads.stencil",
    "hpc_ds1.workloads.nbody",
    "hpc_ds1.workloads.montecarlo",
)

_lock = threading.Lock()
# Held while the built-ins, plug-ins and files are first read: another thread (the gateway
# answers requests from a thread pool) waits for the whole registry instead of seeing it half
# read; re-entrant because reading a file looks the registry up again.
_load_lock = threading.RLock()
_registry: dict[str, Workload] = {}
_sources: dict[str, str] = {}  # name -> "built-in", "plug-in <entry point>" or a file's path
_errors: dict[str, str] = {}  # a plug-in or file that could not be loaded -> why
_homes: set[Path] = set()
_pending: list[Path] = []  # homes given by use_home, not read yet
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
        _sources.pop(name, None)


@contextlib.contextmanager
def preserved() -> Iterator[None]:
    """Whatever is registered inside (register(), a TOML file, a home's files) is forgotten on
    leaving: the registry is as it was on entering. For tests, and for a program that tries
    workloads out before it keeps one."""
    global _loaded
    with _lock:
        registry, sources, errors = dict(_registry), dict(_sources), dict(_errors)
        homes, pending, loaded = set(_homes), list(_pending), _loaded
    try:
        yield
    finally:
        with _lock:
            _registry.clear()
            _registry.update(registry)
            _sources.clear()
            _sources.update(sources)
            _errors.clear()
            _errors.update(errors)
            _homes.clear()
            _homes.update(homes)
            _pending[:] = pending
            _loaded = loaded


def _load() -> None:
    with _load_lock:
        _load_once()


def _load_once() -> None:
    global _loaded
    if _loaded:  # read, or being read by this thread (a file's lookup)
        return
    _loaded = True
    for module in BUILTIN_MODULES:
        _sources[register(importlib.import_module(module).WORKLOAD, replace=True).name] = "built-in"
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        where = f"plug-in {ep.name} = {ep.value}"
        try:
            loaded = ep.load()
            workload = loaded() if callable(loaded) and not isinstance(loaded, Workload) else loaded
        except Exception as error:  # a broken plug-in must not hide every other workload
            _errors[where] = f"cannot load: {type(error).__name__}: {error}"
            continue
        if not isinstance(workload, Workload):
            _errors[where] = f"gives a {type(workload).__name__}, not a Workload"
        elif workload.name in _registry and _registry[workload.name] is not workload:
            _errors[where] = f"its name {workload.name!r} is taken by {_source(workload.name)}"
        else:
            _sources[register(workload).name] = where
    _homes.add(discovery.default_home())
    for path in discovery.workload_files(discovery.default_home()):
        _load_quietly(path)


def _source(name: str) -> str:
    source = _sources.get(name, "register()")
    return f"the built-in workload {name}" if source == "built-in" else source


def _load_quietly(path: Path) -> None:
    try:
        load_file(path)
    except WorkloadFileError as error:
        _errors[str(path)] = str(error)


def load_file(path: str | Path) -> Workload:
    """Register the workload a TOML file declares (WorkloadFileError if the file is not valid
    or its name is taken by a built-in, a plug-in or another file). Loading the same file
    again reads it afresh."""
    _load()
    workload = load_workload_file(path)
    source = workload.source
    with _lock:
        current = _sources.get(workload.name)
        if workload.name in _registry and current != source:
            taken = _source(workload.name)
            raise WorkloadFileError(
                f"{source}: [workload] name: {workload.name!r} is taken by {taken}; "
                "choose another name"
            )
        _registry[workload.name] = workload
        _sources[workload.name] = source
        _errors.pop(source, None)
    return workload


def use_home(home: str | Path) -> None:
    """Also load the workload files of `home` (its workloads/ folder): a command given --home.
    Cheap: the files are read when a workload is first looked up."""
    folder = Path(home).expanduser().resolve()
    with _lock:
        if folder not in _homes:
            _homes.add(folder)
            _pending.append(folder)


def _scan_pending() -> None:
    with _load_lock:
        while _pending:
            folder = _pending.pop(0)
            for path in discovery.home_files(folder):
                if str(path) not in _sources.values():
                    _load_quietly(path)


def source_of(name: str) -> str:
    """Where a workload comes from: "built-in", "plug-in <entry point>", a file, "register()"."""
    _load()
    get_workload(name)
    return _sources.get(name, "register()")


def load_errors() -> dict[str, str]:
    """Plug-ins and workload files that could not be loaded, with why."""
    _load()
    _scan_pending()
    return dict(_errors)


def list_workloads() -> list[str]:
    _load()
    _scan_pending()
    return sorted(_registry)


def get_workload(name: str) -> Workload:
    _load()
    _scan_pending()
    try:
        return _registry[name]
    except KeyError:
        known = ", ".join(sorted(_registry))
        broken = "".join(f"; not loaded: {why}" for why in _errors.values())
        raise UnknownWorkload(
            f"unknown workload {name!r}; known workloads: {known}{broken}"
        ) from None


def resolve(name: str, module: str = "") -> Workload:
    """Find a workload in a fresh process: registry first, then by importing its module."""
    _load()
    _scan_pending()
    if name not in _registry and module:
        mod = importlib.import_module(module)
        if name not in _registry:
            for value in vars(mod).values():
                if isinstance(value, Workload) and value.name == name:
                    register(value)
                    break
    return get_workload(name)
