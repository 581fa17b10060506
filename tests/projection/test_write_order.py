"""The order the store applies a batch's writes in (pure: no database)."""

from __future__ import annotations

from sqlalchemy import column

from hpc_ds1.db import tables
from hpc_ds1.projection.fold import Write
from hpc_ds1.projection.store import by_table


def _w(table: object, n: int, reads_others: bool = False) -> Write:
    return Write(table, "update", {"n": n}, reads_others=reads_others)  # type: ignore[arg-type]


def test_each_table_keeps_its_own_order_and_a_reading_write_sees_all_before_it() -> None:
    s, d, t = tables.sessions, tables.devices, tables.tasks
    writes = [_w(s, 1), _w(t, 2), _w(s, 3), _w(d, 4, reads_others=True), _w(t, 5), _w(s, 6)]
    ordered = by_table(writes)
    assert sorted(w.row["n"] for w in ordered) == [1, 2, 3, 4, 5, 6]  # nothing lost or doubled
    position = {w.row["n"]: i for i, w in enumerate(ordered)}
    # the barrier: everything before it is applied before it, everything after, after
    assert all(position[n] < position[4] for n in (1, 2, 3))
    assert all(position[n] > position[4] for n in (5, 6))
    # between barriers, a table's writes are together and in their order
    assert [w.row["n"] for w in ordered[:3]] == [1, 3, 2]  # sessions (1, 3), then tasks (2)
    assert position[1] < position[3]
    # conditions travel untouched
    cond = Write(t, "update", {"n": 7}, where=(column("x") == 1,))
    assert by_table([cond])[0] is cond
