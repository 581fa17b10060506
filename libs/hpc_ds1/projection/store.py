"""Applies folded events to Postgres: raw rows, typed writes, checkpoint, in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import orjson
import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import Connection, Table, bindparam, exc, select, update
from sqlalchemy.dialects.postgresql import JSONB, insert

from hpc_ds1.db import tables

from .fold import Folded, SetAside, Write, set_aside

PROJECTION = "main"


def read_checkpoint(conn: Connection, lock: bool = False) -> int:
    """The last applied sequence; with `lock`, held until the transaction ends."""
    conn.execute(
        insert(tables.checkpoints)
        .values(name=PROJECTION, last_seq=0)
        .on_conflict_do_nothing(index_elements=["name"])
    )
    query = select(tables.checkpoints.c.last_seq).where(tables.checkpoints.c.name == PROJECTION)
    if lock:
        query = query.with_for_update()
    return int(conn.execute(query).scalar_one())


def write_checkpoint(conn: Connection, seq: int) -> None:
    conn.execute(
        update(tables.checkpoints)
        .where(tables.checkpoints.c.name == PROJECTION)
        .values(last_seq=seq)
    )


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def copy_rows(conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    """COPY straight into `table`: only for rows that cannot exist yet."""
    if rows:
        _copy(conn, table, table.name, rows)


# Per table: its columns, and the places of its JSON columns (each row's JSON values are wrapped
# for psycopg in place, instead of asking every column whether it is JSON, for every row).
_PLANS: dict[str, tuple[list[str], list[int]]] = {}


def _plan(table: Table) -> tuple[list[str], list[int]]:
    plan = _PLANS.get(table.name)
    if plan is None or len(plan[0]) != len(table.columns):
        columns = [c.name for c in table.columns]
        json_at = [i for i, c in enumerate(table.columns) if isinstance(c.type, JSONB)]
        plan = _PLANS[table.name] = (columns, json_at)
    return plan


def _copy(conn: Connection, table: Table, target: str, rows: Sequence[dict[str, Any]]) -> None:
    columns, json_at = _plan(table)
    cursor = conn.connection.cursor()
    with cursor.copy(f"COPY {target} ({', '.join(columns)}) FROM STDIN") as copy:  # type: ignore[attr-defined]
        write = copy.write_row
        for row in rows:
            get = row.get
            values = [get(c) for c in columns]
            for i in json_at:
                if values[i] is not None:
                    values[i] = Jsonb(values[i], dumps=_dumps)
            write(values)


STAGE_FROM = 64  # rows: fewer go in one multi-row INSERT, more through COPY and a staging table


def insert_rows(conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    """INSERT ... ON CONFLICT DO NOTHING for many rows, in one statement: a multi-row INSERT
    for a few, else COPY into a staging table and one INSERT ... SELECT (an executemany is a
    round trip per row, about 2,000 rows/s here). The staging table is emptied by TRUNCATE:
    a DELETE leaves its rows dead until the transaction ends, and a rebuild is one
    transaction, so every later INSERT ... SELECT scanned every row staged before it (the
    rebuild ran at 362 events/s, docs/performance.md)."""
    if not rows:
        return
    keys = [c.name for c in table.primary_key.columns]
    columns = [c.name for c in table.columns]
    if len(rows) < STAGE_FROM:
        # a row may carry more than the table holds (COPY takes only the table's columns)
        values = [{c: r.get(c) for c in columns} for r in rows]
        conn.execute(insert(table).values(values).on_conflict_do_nothing(index_elements=keys))
        return
    key = ", ".join(keys)
    stage = f"stage_{table.name}"
    cursor = conn.connection.cursor()
    cursor.execute(
        f"CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE {table.name}) ON COMMIT DELETE ROWS"
    )
    names = ", ".join(columns)
    _copy(conn, table, stage, rows)
    cursor.execute(
        f"INSERT INTO {table.name} ({names}) SELECT {names} FROM {stage} "
        f"ON CONFLICT ({key}) DO NOTHING"
    )
    cursor.execute(f"TRUNCATE {stage}")


def by_table(writes: Sequence[Write]) -> list[Write]:
    """The writes table by table (a stable sort: each table's own writes keep their order),
    between the writes that read other tables (`Write.reads_others`), which stay where they
    are and see everything before them. The read models have no foreign keys, so one table's
    rows never depend on when another's were written; grouped so, a batch's writes to a table
    go in a few statements instead of one per run of consecutive writes (the rebuild of a
    year, docs/performance.md)."""
    out: list[Write] = []
    run: list[Write] = []
    for write in writes:
        if write.reads_others:
            out += sorted(run, key=lambda w: w.table.name)
            out.append(write)
            run = []
        else:
            run.append(write)
    return out + sorted(run, key=lambda w: w.table.name)


def _run_writes(conn: Connection, writes: Sequence[Write]) -> None:
    # Consecutive writes of one kind to one table go in one statement; each table's order is
    # kept (`by_table`).
    grouped = groupby(by_table(writes), key=lambda w: (w.table, w.kind, tuple(w.row)))
    for (table, kind, _), group in grouped:
        batch = list(group)
        rows = [w.row for w in batch]
        key = [c.name for c in table.primary_key.columns]
        if kind == "insert":
            insert_rows(conn, table, rows)
        elif kind == "upsert":
            for write in batch:
                stmt = insert(table).values(write.row)
                changed = {
                    c: stmt.excluded[c]
                    for c in write.row
                    if c not in key and c not in write.keep_on_update
                }
                conn.execute(stmt.on_conflict_do_update(index_elements=key, set_=changed))
        elif any(w.where for w in batch):
            for write in batch:  # conditional: one statement each, its values may be SQL
                conn.execute(
                    update(table)
                    .where(*[table.c[k] == write.row[k] for k in key], *write.where)
                    .values({c: v for c, v in write.row.items() if c not in key})
                )
        else:
            columns = [c for c in rows[0] if c not in key]
            by_key = (
                update(table)
                .where(*[table.c[k] == bindparam(f"k_{k}") for k in key])
                .values({c: bindparam(f"v_{c}") for c in columns})
            )
            params = [
                {**{f"k_{k}": r[k] for k in key}, **{f"v_{c}": r[c] for c in columns}} for r in rows
            ]
            conn.execute(by_key, params)


def apply_batch(
    conn: Connection, folded: Sequence[Folded], checkpoint: int
) -> tuple[list[Folded], int]:
    """Apply what lies beyond `checkpoint`; returns (applied, new checkpoint). The caller
    holds the checkpoint lock and commits. Raises if Postgres refuses any row of the batch."""
    fresh = [f for f in folded if f.seq > checkpoint]
    if not fresh:
        return [], checkpoint
    # Under the checkpoint lock no row beyond the checkpoint exists yet: COPY needs no staging.
    copy_rows(conn, tables.events, [f.raw_row for f in fresh])
    _run_writes(conn, [w for f in fresh for w in f.writes])
    last = max(f.seq for f in fresh)
    write_checkpoint(conn, last)
    return fresh, last


# SQLSTATE classes that mean "this row cannot be stored": data exception (a value out of range,
# a NUL byte, invalid JSON text), integrity violation (an event id seen before), program limit
# exceeded (a text too large for its index). Anything else (the connection, a deadlock, a full
# disk, a missing table) is the database's state, not the event's fault.
REFUSING_SQLSTATE_CLASSES = ("22", "23", "54")


def is_refusal(error: BaseException) -> bool:
    """Whether Postgres (or the encoder before it) refused this event's rows for what they
    hold; if not, the failure is retried and the event is never set aside for it."""
    cause: BaseException = error
    if isinstance(error, exc.DBAPIError):
        if error.connection_invalidated:
            return False
        cause = error.orig or error
    if isinstance(cause, psycopg.Error):
        if cause.sqlstate is None:  # raised before it reached the server (a NUL byte in text)
            return isinstance(cause, psycopg.DataError | psycopg.IntegrityError)
        return cause.sqlstate[:2] in REFUSING_SQLSTATE_CLASSES
    if isinstance(cause, OSError | exc.SQLAlchemyError):
        return False
    # A value the encoders cannot write (an integer past 64 bits, a lone surrogate).
    return isinstance(cause, Exception)


def refusal(error: BaseException) -> str:
    """One line saying why Postgres (or the encoder) refused an event, without the SQL."""
    cause = getattr(error, "orig", None) or error
    first = (str(cause).strip().splitlines() or [""])[0]
    if isinstance(cause, psycopg.Error) and cause.diag.message_detail:
        first = f"{first} ({cause.diag.message_detail})"
    return f"{type(cause).__name__}: {first}"


@dataclass(frozen=True)
class Applied:
    applied: list[Folded]
    set_aside: list[SetAside]
    checkpoint: int


def apply(conn: Connection, folded: Sequence[Folded], checkpoint: int) -> Applied:
    """Apply a batch; if Postgres refuses any of it, apply it again one event at a time, each
    in its own savepoint, and set aside (with the reason) each event it refuses. A poison event
    costs its own rows, never the events after it; any other failure is raised."""
    batch = conn.begin_nested()
    try:
        applied, last = apply_batch(conn, folded, checkpoint)
    except Exception as error:
        batch.rollback()
        if not is_refusal(error):
            raise
    else:
        batch.commit()
        return Applied(applied, [], last)
    return _apply_each(conn, [f for f in folded if f.seq > checkpoint], checkpoint)


def _apply_each(conn: Connection, fresh: Sequence[Folded], checkpoint: int) -> Applied:
    applied: list[Folded] = []
    aside: list[SetAside] = []
    for item in fresh:
        one = conn.begin_nested()
        try:
            copy_rows(conn, tables.events, [item.raw_row])
            _run_writes(conn, item.writes)
        except Exception as error:
            one.rollback()
            if not is_refusal(error):
                raise
            kept = set_aside(item, refusal(error))
            copy_rows(conn, tables.set_aside, [kept.row])
            raw = conn.begin_nested()
            try:  # its place in the raw log, reduced to what always fits
                copy_rows(conn, tables.events, [kept.raw_row])
            except Exception as second:
                raw.rollback()
                if not is_refusal(second):
                    raise
            else:
                raw.commit()
            aside.append(kept)
        else:
            one.commit()
            applied.append(item)
    last = max((f.seq for f in fresh), default=checkpoint)
    if last > checkpoint:
        write_checkpoint(conn, last)
    return Applied(applied, aside, max(last, checkpoint))


def record_gaps(conn: Connection, missing: Sequence[tuple[int, int]]) -> None:
    if missing:
        insert_rows(conn, tables.gaps, [{"from_seq": a, "to_seq": b} for a, b in missing])


def truncate_read_models(conn: Connection) -> None:
    names = ", ".join(t.name for t in tables.READ_MODELS)
    conn.exec_driver_sql(f"TRUNCATE {names}")
    write_checkpoint(conn, 0)
