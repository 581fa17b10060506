"""Generated requests (schemathesis on the gateway's own OpenAPI spec, hypothesis underneath) for
each role and for no credential, on a real stack where nothing can run for real (no agent: no
device joins). A few hundred here; `python benchmarks/fuzz_api.py` sends 5,000 and more."""

from __future__ import annotations

from sqlalchemy import Engine

from benchmarks.fuzz_api import ROLES, role_name, run_fuzz
from hpc_ds1.infra.ports import free_port
from hpc_ds1.settings import Settings


async def test_generated_requests_get_no_5xx_and_match_the_spec(
    settings: Settings, engine: Engine
) -> None:
    assert settings.nats_url and settings.database_url
    served = settings.model_copy(update={"port": free_port(), "log_level": "error"})
    report = await run_fuzz(
        served, served.nats_url, served.database_url, served.nats_url, total=300, seed=7
    )
    summary = "\n".join(report.lines())
    assert report.requests >= 250, summary
    assert report.server_errors == 0, summary
    assert report.violations == [], summary
    # Every role was exercised, and without a credential nothing but health answered 2xx.
    assert {role_name(r) for r in ROLES} <= set(report.by_role), summary
    anonymous = report.by_role["none"]
    assert anonymous["4xx"] > 0 and anonymous["2xx"] <= anonymous["4xx"] / 4, summary
    assert report.by_role["viewer"]["2xx"] > 0, summary
