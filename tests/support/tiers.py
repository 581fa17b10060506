"""How the suite is cut: the folders whose tests go to one xdist worker whole, and the tier each
folder's tests are marked with (tests/conftest.py applies both)."""

from __future__ import annotations

# `make pytest` runs two pytest-xdist workers (--dist loadscope). The unit of work is a module,
# except the folders below: their tests share a package or session fixture, or drive a
# machine-wide service, so each folder goes to one worker whole (tests/conftest.py's scheduler),
# and the folders are queued first, longest first (CI's --durations), so that neither worker is
# left with one of them at the end. The scheduler groups by nodeid in the controller: xdist's own
# xdist_group marks do not reach its scheduler under pytest 9.2 (the nodeid suffix it sets is no
# longer read).
SHARED_FOLDERS = (
    "tests/e2e/",  # a really measured and trained device (package fixtures)
    "tests/fleet_e2e/",  # network namespaces, one per device
    "tests/console/",  # one browser and one served product (package fixtures)
    "tests/slurm/",  # one real slurmctld + slurmd for the session
)


def work_unit(nodeid: str) -> str:
    """What goes to one worker whole: a shared folder, else the test's module."""
    path = nodeid.split("::")[0]
    return next((folder for folder in SHARED_FOLDERS if path.startswith(folder)), path)


# The tiers (pyproject.toml registers the markers; docs/contributing.md says what each is for).
# A folder's tier comes from here, so its tests need no mark of their own; `slow` is set on the
# test itself, beside the small version that stays in the default run.
FOLDER_TIERS = {
    "tests/e2e/": "e2e",  # a really measured and trained device
    "tests/deploy/": "e2e",  # every service as its own process, replicas, kill -9
    "tests/apps/": "e2e",  # a real application (hpcc) under Open MPI
    "tests/upgrade/": "e2e",  # a home made by the previous release's code, served by this one
    "tests/console/": "browser",  # Debian's chromium through Playwright
    "tests/fleet_e2e/": "netns",  # agents in network namespaces (root)
    "tests/slurm/": "slurm",  # a real slurmctld + slurmd
    "tests/cluster/": "cluster",  # a three-node NATS cluster, a site's Postgres role
    "tests/compose/": "compose",  # docker-compose.yml under podman (make test-compose)
}


# The inner loop (`make test-fast`) leaves out, besides the tiers above, the modules that took
# longest in the last recorded run of the default tier (tests/durations.json, written by `make
# test-durations`): they start `serve`, run real MPI jobs or train models. A module takes its
# whole time to one worker (its module fixtures), so a module is the unit; a module not in the
# file yet (a new one) stays in the loop until the next recording.
DURATIONS = "tests/durations.json"
HEAVY_S = 8.0


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def module_seconds(reports: list[dict[str, object]]) -> dict[str, float]:
    """Each module's setup + call + teardown seconds, from recorded test reports."""
    seconds: dict[str, float] = {}
    for report in reports:
        module = module_of(str(report["nodeid"]))
        duration = report["duration"]
        assert isinstance(duration, int | float)
        seconds[module] = seconds.get(module, 0.0) + float(duration)
    return {module: round(s, 2) for module, s in sorted(seconds.items())}


def heavy_modules(seconds: dict[str, float], limit_s: float = HEAVY_S) -> set[str]:
    return {module for module, s in seconds.items() if s > limit_s}
