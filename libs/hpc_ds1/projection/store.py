"""Applies folded events to Postgres: raw rows, typed writes, checkpoint, in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from sqlalchemy import Boolean, Connection, Integer, Table, UniqueConstraint, exc, select, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB, insert

from hpc_ds1.db import tables

from .fold import Folded, Row, SetAside, Write, set_aside

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


def _copy(
    conn: Connection,
    table: Table,
    target: str,
    rows: Sequence[dict[str, Any]],
    extra: tuple[str, Sequence[Any]] | None = None,
) -> None:
    """COPY `rows` (the table's columns) into `target`; `extra`: one more column, its name
    and each row's value."""
    columns, json_at = _plan(table)
    names = [*columns, extra[0]] if extra else columns
    cursor = conn.connection.cursor()
    with cursor.copy(f"COPY {target} ({', '.join(names)}) FROM STDIN") as copy:  # type: ignore[attr-defined]
        write = copy.write_row
        for n, row in enumerate(rows):
            get = row.get
            values = [get(c) for c in columns]
            for i in json_at:
                if values[i] is not None:
                    values[i] = Jsonb(values[i], dumps=_dumps)
            if extra:
                values.append(extra[1][n])
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


def _defaults_of(table: Table) -> Row:
    """Each column's value where an upsert leaves it out: its server default, as Postgres
    fills it in (None where it has none)."""
    found: Row = {}
    for column in table.columns:
        default = column.server_default
        text = getattr(default, "arg", None)
        if default is None:
            found[column.name] = None
        elif isinstance(column.type, Boolean) and text in ("true", "false"):
            found[column.name] = text == "true"
        elif isinstance(column.type, Integer) and isinstance(text, str):
            found[column.name] = int(text)
        else:  # a default the fold cannot know without asking Postgres
            raise ValueError(f"{table.name}.{column.name}: server default {default!r}")
    return found


# Read at import, so that a read model given a default the fold cannot know fails every test
# at once, not a batch at run time (where it would read as a refused event).
_DEFAULTS: dict[str, Row] = {t.name: _defaults_of(t) for t in tables.READ_MODELS}


def _defaults(table: Table) -> Row:
    found = _DEFAULTS.get(table.name)
    if found is None:
        found = _DEFAULTS[table.name] = _defaults_of(table)
    return found


@dataclass
class Versions:
    """One table's rows as a batch's writes leave them: every version a write made (each must
    be one Postgres takes), the key of each, and each key's last."""

    table: Table
    rows: list[Row] = field(default_factory=list)
    keys: list[Any] = field(default_factory=list)
    applied: list[bool] = field(default_factory=list)  # False: an insert that found its row

    def final(self) -> list[bool]:
        last = {
            key: i
            for i, (key, took) in enumerate(zip(self.keys, self.applied, strict=True))
            if took
        }
        return [last.get(key) == i for i, key in enumerate(self.keys)]


def _key(table: Table, row: Row) -> Any:
    (column,) = table.primary_key.columns  # every read model has a one-column key
    return row[column.name]


def fold_writes(writes: Sequence[Write], found: dict[str, dict[Any, Row]]) -> dict[str, Versions]:
    """Apply `writes` in their order to the rows `found` (by table name, by key: the rows as
    Postgres holds them now), in memory, as the statements one per write would have: an insert
    changes nothing where its row exists, an update nothing where it does not, a `change`
    reads the rows as the writes before it left them. Pure: `found` is left as it was."""
    rows = {name: dict(by_key) for name, by_key in found.items()}
    out: dict[str, Versions] = {}
    for write in writes:
        table = write.table
        current = rows.setdefault(table.name, {})
        versions = out.setdefault(table.name, Versions(table))
        key = _key(table, write.row)
        row = current.get(key)
        if write.kind == "insert":
            candidate = {c.name: write.row.get(c.name) for c in table.columns}
            versions.rows.append(candidate)
            versions.keys.append(key)
            versions.applied.append(row is None)
            if row is None:
                current[key] = candidate
            continue
        if write.kind == "upsert":
            if row is None:
                new = {**_defaults(table), **write.row}
            else:
                kept = set(write.keep_on_update)
                new = {**row, **{c: v for c, v in write.row.items() if c not in kept}}
        elif row is None:
            continue
        elif write.change is not None:
            read = tuple(rows.get(t.name, {}).get(k) for t, k in write.reads)
            values = write.change(row, read)
            if values is None:
                continue
            new = {**row, **values}
        else:
            new = {**row, **write.row}
        current[key] = new
        versions.rows.append(new)
        versions.keys.append(key)
        versions.applied.append(True)
    return out


def _load(conn: Connection, table: Table, keys: Sequence[Any]) -> dict[Any, Row]:
    (column,) = table.primary_key.columns
    kind = column.type.compile(dialect=postgresql.dialect())
    cursor = conn.connection.cursor(row_factory=dict_row)  # type: ignore[call-overload]
    cursor.execute(
        f"SELECT * FROM {table.name} WHERE {column.name} = ANY(%s::{kind}[])", [list(keys)]
    )
    return {row[column.name]: row for row in cursor.fetchall()}


def _stage_for(conn: Connection, table: Table) -> str:
    """A session's staging table for `table`'s row versions, with `table`'s columns, NOT NULL
    constraints and indexes (none unique): a version Postgres would have refused in `table`
    (a value out of range, a NULL, an index entry too large) is refused here too, even where a
    later write of the batch replaces it."""
    stage = f"fold_{table.name}"
    statements = [
        f"CREATE TEMP TABLE IF NOT EXISTS {stage} "
        f"(LIKE {table.name}, stage_final boolean NOT NULL) ON COMMIT DELETE ROWS"
    ]
    indexed = [tuple(c.name for c in table.primary_key.columns)]
    indexed += [tuple(c.name for c in index.columns) for index in table.indexes]
    indexed += [
        tuple(c.name for c in constraint.columns)
        for constraint in table.constraints
        if isinstance(constraint, UniqueConstraint)
    ]
    for i, columns in enumerate(dict.fromkeys(indexed)):
        statements.append(
            f"CREATE INDEX IF NOT EXISTS {stage}_{i} ON {stage} ({', '.join(columns)})"
        )
    conn.connection.cursor().execute("; ".join(statements))
    return stage


def _write_versions(conn: Connection, versions: Versions) -> None:
    """Every version into the staging table (so Postgres checks each), then each key's last
    into the table, inserted or replacing the row: one statement for the table's batch."""
    table = versions.table
    stage = _stage_for(conn, table)
    final = versions.final()
    _copy(conn, table, stage, versions.rows, extra=("stage_final", final))
    columns = [c.name for c in table.columns]
    key = ", ".join(c.name for c in table.primary_key.columns)
    names = ", ".join(columns)
    changed = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c not in key.split(", "))
    conn.connection.cursor().execute(
        f"INSERT INTO {table.name} ({names}) SELECT {names} FROM {stage} WHERE stage_final "
        f"ON CONFLICT ({key}) DO UPDATE SET {changed}; TRUNCATE {stage}"
    )


def _run_writes(conn: Connection, writes: Sequence[Write]) -> None:
    """A batch's writes, a few statements per table. Tables only inserted into take their
    rows as they come (`insert_rows`); the others are folded in memory (`fold_writes`) from
    their rows as they are, read in one statement per table, and written back in one (the
    rebuild of a year went from a round trip per two events to a few per batch,
    docs/performance.md)."""
    folded = {w.table.name for w in writes if w.kind != "insert"}
    folded |= {t.name for w in writes for t, _ in w.reads}
    inserts: dict[str, list[Row]] = {}
    tables_by_name: dict[str, Table] = {}
    keys: dict[str, dict[Any, None]] = {}
    for write in writes:
        name = write.table.name
        tables_by_name[name] = write.table
        if name not in folded:
            inserts.setdefault(name, []).append(write.row)
            continue
        keys.setdefault(name, {})[_key(write.table, write.row)] = None
        for table, key in write.reads:
            tables_by_name[table.name] = table
            keys.setdefault(table.name, {})[key] = None
    for name, rows in inserts.items():
        insert_rows(conn, tables_by_name[name], rows)
    if not keys:
        return
    found = {name: _load(conn, tables_by_name[name], list(k)) for name, k in keys.items()}
    for versions in fold_writes([w for w in writes if w.table.name in folded], found).values():
        if versions.rows:
            _write_versions(conn, versions)


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
    """Apply a batch; if Postgres refuses any of it, apply it again in halves, each in its own
    savepoint, halving what is refused down to single events, and set aside (with the reason)
    each event it refuses. A poison event costs its own rows, never the events after it; any
    other failure is raised."""
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
    fresh = [f for f in folded if f.seq > checkpoint]
    result = Applied([], [], checkpoint)
    middle = len(fresh) // 2
    _apply_parts(conn, fresh[:middle], result)
    _apply_parts(conn, fresh[middle:], result)
    last = max((f.seq for f in fresh), default=checkpoint)
    if last > checkpoint:
        write_checkpoint(conn, last)
    return Applied(result.applied, result.set_aside, max(last, checkpoint))


def _apply_parts(conn: Connection, part: Sequence[Folded], result: Applied) -> None:
    """`part` whole if Postgres takes it, else its halves, in order. A part is taken whole
    exactly when each of its events would be, one after the other (every row version a write
    makes is checked, `_write_versions`), so which events are set aside does not depend on
    how the log was cut into batches; halving finds a batch's few refused events in about
    log2(batch) tries each instead of one try per event."""
    if not part:
        return
    one = conn.begin_nested()
    try:
        copy_rows(conn, tables.events, [f.raw_row for f in part])
        _run_writes(conn, [w for f in part for w in f.writes])
    except Exception as error:
        one.rollback()
        if not is_refusal(error):
            raise
        if len(part) > 1:
            middle = len(part) // 2
            _apply_parts(conn, part[:middle], result)
            _apply_parts(conn, part[middle:], result)
            return
        kept = set_aside(part[0], refusal(error))
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
        result.set_aside.append(kept)
    else:
        one.commit()
        result.applied.extend(part)


def record_gaps(conn: Connection, missing: Sequence[tuple[int, int]]) -> None:
    if missing:
        insert_rows(conn, tables.gaps, [{"from_seq": a, "to_seq": b} for a, b in missing])


def truncate_read_models(conn: Connection) -> None:
    names = ", ".join(t.name for t in tables.READ_MODELS)
    conn.exec_driver_sql(f"TRUNCATE {names}")
    write_checkpoint(conn, 0)
