"""How the store folds a batch's writes in memory before writing each row once (pure: no
database): in their order, as one statement per write would have applied them."""

from __future__ import annotations

from typing import Any

from hpc_ds1.db import tables
from hpc_ds1.projection.fold import Row, Write
from hpc_ds1.projection.store import fold_writes

t, d = tables.tasks, tables.devices


def _finals(versions: Any) -> list[Row]:
    return [row for row, last in zip(versions.rows, versions.final(), strict=True) if last]


def test_a_change_reading_another_table_sees_every_write_before_it() -> None:
    def seen(row: Row, task: tuple[Row | None, ...]) -> Row | None:
        return {"liveness_reason": task[0]["status"] if task[0] else "absent"}

    reads_task = Write(d, "update", {"device_id": "d1"}, change=seen, reads=((t, "t1"),))
    writes = [
        reads_task,  # before the task exists
        Write(t, "insert", {"task_id": "t1", "status": "submitted"}),
        Write(t, "update", {"task_id": "t1", "status": "placed"}),
        reads_task,  # after both task writes, though they are of another table
        Write(t, "update", {"task_id": "t1", "status": "running"}),
    ]
    found = {"devices": {"d1": {"device_id": "d1", "liveness_reason": None}}, "tasks": {}}
    out = fold_writes(writes, found)
    assert [r["liveness_reason"] for r in out["devices"].rows] == ["absent", "placed"]
    assert [r["status"] for r in out["tasks"].rows] == ["submitted", "placed", "running"]
    assert _finals(out["tasks"])[0]["status"] == "running"
    assert found["tasks"] == {} and found["devices"]["d1"]["liveness_reason"] is None  # untouched


def test_inserts_updates_and_upserts_as_their_statements_would() -> None:
    old = {"device_id": "d1", "hostname": "h0", "registered_at": 1, "off_estimates": 3}
    writes = [
        Write(d, "update", {"device_id": "ghost", "hostname": "x"}),  # no row: nothing
        Write(
            d,
            "upsert",
            {"device_id": "d1", "hostname": "h1", "registered_at": 2},
            ("registered_at",),
        ),
        Write(d, "upsert", {"device_id": "d2", "hostname": "h2", "registered_at": 5}),
        Write(t, "insert", {"task_id": "t1", "status": "submitted"}),
        Write(t, "insert", {"task_id": "t1", "status": "again"}),  # present: nothing
        Write(t, "update", {"task_id": "t1"}, change=lambda row, _: None),  # refuses: nothing
    ]
    out = fold_writes(writes, {"devices": {"d1": old}, "tasks": {}})
    d1, d2 = _finals(out["devices"])
    assert (d1["hostname"], d1["registered_at"], d1["off_estimates"]) == ("h1", 1, 3)
    # a row an upsert creates takes the columns' server defaults, as Postgres fills them in
    assert (d2["draining"], d2["off_estimates"], d2["liveness"]) == (False, 0, None)
    # the refused insert is still a version Postgres must take (its values are checked), never
    # the row's last
    assert [r["status"] for r in out["tasks"].rows] == ["submitted", "again"]
    assert out["tasks"].final() == [True, False]
    assert [r["status"] for r in _finals(out["tasks"])] == ["submitted"]
