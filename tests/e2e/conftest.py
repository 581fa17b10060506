"""One real measured-and-trained device for the end-to-end tests of this folder: a tiny setup
(real numba runs under real MPI ranks), a model trained by the trainer service, all on the
session's NATS and Postgres with this module's own stream, database and home."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest

from hpc_ds1.eventlog.subjects import train_subject
from hpc_ds1.machine.hardware import fingerprint
from hpc_ds1.settings import Settings
from hpc_ds1.setup import PROFILES, Campaign, plan_jobs
from hpc_ds1.space import ConfigSpace
from hpc_ds1.stack import open_stack
from hpc_ds1.workloads import get_workload
from tests.support.databases import create_database, drop_database

TINY_SIZES = {"gemm": [192, 288, 384], "montecarlo": [200_000, 400_000]}


@pytest.fixture(scope="package")
def e2e_settings(
    tmp_path_factory: pytest.TempPathFactory, nats_url: str, postgres_url: str
) -> Iterator[Settings]:
    database_url = create_database(postgres_url, "e2e")
    tag = uuid.uuid4().hex[:10]
    yield Settings(
        home=tmp_path_factory.mktemp("e2e") / "home",
        nats_url=nats_url,
        database_url=database_url,
        stream=f"E2E_{tag}",
        subject_prefix=f"e{tag}",
        port=0,
        log_json=True,
    )
    drop_database(postgres_url, database_url)


@pytest.fixture(scope="package")
async def trained(e2e_settings: Settings) -> AsyncIterator[dict]:
    fp = fingerprint()
    chunks = []
    for name, sizes in TINY_SIZES.items():
        wl = get_workload(name)
        chunks += plan_jobs([wl], {name: ConfigSpace.for_device(fp, wl)}, PROFILES["quick"], sizes)
    async with open_stack(e2e_settings, ("projector", "agent", "trainer"), "e2e-setup") as stack:
        device_id = await stack.local_device()
        report = await Campaign(stack, device_id).run(chunks, lambda *_: None)
        assert report.failed == 0
        await stack.caught_up()
        reply = await stack.bus.nc.request(
            train_subject(e2e_settings), orjson.dumps({"device_id": device_id}), timeout=600
        )
        answer = orjson.loads(reply.data)
        assert answer["ok"], answer
        await stack.caught_up()
    yield {"device_id": device_id, "version": answer["version"], "home": Path(e2e_settings.home)}
