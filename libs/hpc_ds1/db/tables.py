"""The read models the projector folds the event log into. Change them only with a migration."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()

events = Table(
    "events",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("event_id", Text, unique=True),
    Column("type", Text, nullable=False, index=True),
    Column("version", Integer),
    Column("subject", Text, nullable=False, index=True),
    Column("time", DateTime(timezone=True)),
    Column("actor", Text),
    Column("source", Text),
    Column("correlation_id", Text, index=True),
    Column("causation_id", Text),
    Column("data", JSONB),
    Column("valid", Boolean, nullable=False),
    Column("error", Text),
    Column("raw", Text, doc="The undecodable bytes of a malformed message, as text."),
)

checkpoints = Table(
    "projection_checkpoint",
    metadata,
    Column("name", Text, primary_key=True),
    Column("last_seq", BigInteger, nullable=False),
)

gaps = Table(
    "projection_gaps",
    metadata,
    Column("from_seq", BigInteger, primary_key=True, autoincrement=False),
    Column("to_seq", BigInteger, nullable=False),
)

set_aside = Table(
    "projection_set_aside",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("subject", Text, nullable=False),
    Column("event_id", Text, doc="The envelope's id, when it has one (NUL bytes escaped)."),
    Column("type", Text),
    Column("reason", Text, nullable=False, doc="Why Postgres (or the fold) refused it."),
    Column("raw", LargeBinary, nullable=False, doc="The stored message's bytes, unchanged."),
)

devices = Table(
    "devices",
    metadata,
    Column("device_id", Text, primary_key=True),
    Column("hostname", Text, nullable=False),
    Column("fingerprint", JSONB, nullable=False),
    Column("local", Boolean, nullable=False),
    Column("status", Text, nullable=False),
    Column("registered_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("draining", Boolean, nullable=False, server_default="false"),
    Column("liveness", Text, doc="online or offline, from device.status_changed; NULL: never"),
    Column("liveness_reason", Text),
    Column(
        "off_estimates",
        Integer,
        nullable=False,
        server_default="0",
        doc="Its finished tasks whose runtime was far from its own estimate.",
    ),
    Column("off_estimate", Text, doc="The last of them: the task and how far off."),
)

tasks = Table(
    "tasks",
    metadata,
    Column("task_id", Text, primary_key=True),
    Column("workload", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("submitted_by", Text, nullable=False),
    Column(
        "status",
        Text,
        nullable=False,
        index=True,
        doc="submitted, waiting, placed, running, finished or failed",
    ),
    Column("attempt", Integer, nullable=False, server_default="0"),
    Column("device_id", Text, index=True, doc="The device of the current attempt."),
    Column("config", JSONB),
    Column("expected_s", Float),
    Column("queue_s", Float),
    Column("basis", Text),
    Column("reason", Text, doc="Why placement chose the device (or what the task waits for)."),
    Column("runner_up", Text),
    Column("placement", JSONB, doc="The last task.placed event's data, candidates included."),
    Column("runtime_s", Float),
    Column("measurement_id", Text),
    Column(
        "off_estimate",
        Text,
        doc="Finished far from the device's own estimate: how far (NULL: it was not).",
    ),
    Column("failures", JSONB, nullable=False, doc="Each abandoned attempt's reason, in order."),
    Column("submitted_at", DateTime(timezone=True), nullable=False),
    Column("placed_at", DateTime(timezone=True)),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("seq", BigInteger, nullable=False),
)

measurements = Table(
    "measurements",
    metadata,
    Column("measurement_id", Text, primary_key=True),
    Column("device_id", Text, nullable=False, index=True),
    Column("workload", Text, nullable=False, index=True),
    Column("size", BigInteger, nullable=False),
    Column("config", JSONB, nullable=False),
    Column("status", Text, nullable=False),
    Column("runtime_s", Float),
    Column("throughput", Float),
    Column("throughput_unit", Text),
    Column("repeats", Integer, nullable=False),
    Column("spread", Float),
    Column("check_ok", Boolean),
    Column("check_error", Float),
    Column("held_out", Boolean, nullable=False),
    Column("purpose", Text, nullable=False),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("seq", BigInteger, nullable=False),
)

models = Table(
    "models",
    metadata,
    Column("model_version", Text, primary_key=True),
    Column("device_id", Text, nullable=False, index=True),
    Column("artifact", Text, nullable=False),
    Column("sha256", Text, nullable=False),
    Column("metrics", JSONB, nullable=False),
    Column("trained_on", Integer, nullable=False),
    Column("published_at", DateTime(timezone=True), nullable=False),
    Column("seq", BigInteger, nullable=False),
)

evaluations = Table(
    "evaluations",
    metadata,
    Column("evaluation_id", Text, primary_key=True),
    Column("device_id", Text, nullable=False, index=True),
    Column("model_version", Text, nullable=False, index=True),
    Column("profile", Text, nullable=False),
    Column("seed", BigInteger, nullable=False),
    Column("landscape_runs", Integer, nullable=False),
    Column("results", JSONB, nullable=False),
    Column("plots", JSONB, nullable=False),
    Column("published_at", DateTime(timezone=True), nullable=False),
    Column("seq", BigInteger, nullable=False),
)

decisions = Table(
    "decisions",
    metadata,
    Column("decision_id", Text, primary_key=True),
    Column("device_id", Text, nullable=False, index=True),
    Column("source", Text, nullable=False),
    Column("workload", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("config", JSONB, nullable=False),
    Column("choice", Text, nullable=False),
    Column("confidence", Float, nullable=False),
    Column("mode", Text, nullable=False),
    Column("reasons", JSONB, nullable=False),
    Column("alternatives", JSONB, nullable=False),
    Column("model_version", Text),
    Column("session_id", Text, index=True),
    Column("actor", Text, nullable=False),
    Column("approved_by", Text, doc="'auto', or the engineer who approved the move"),
    Column("approval", Text, doc="auto, waiting, approved or rejected; NULL: none asked"),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("seq", BigInteger, nullable=False),
)

sessions = Table(
    "sessions",
    metadata,
    Column("session_id", Text, primary_key=True),
    Column("device_id", Text, nullable=False, index=True),
    Column("workload", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("start", JSONB, nullable=False),
    Column("owner", Text, nullable=False),
    Column("status", Text, nullable=False, index=True),
    Column("best_config", JSONB),
    Column("best_runtime_s", Float),
    Column("start_runtime_s", Float),
    Column("speedup", Float),
    Column("real_runs", Integer, nullable=False),
    Column("finish_reason", Text),
    Column("detail", Text),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("seq", BigInteger, nullable=False),
)

approvals = Table(
    "approvals",
    metadata,
    Column("approval_id", Text, primary_key=True),
    Column("session_id", Text, nullable=False, index=True),
    Column("decision_id", Text, nullable=False),
    Column("device_id", Text, nullable=False),
    Column("workload", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("config", JSONB, nullable=False),
    Column("move", Text, nullable=False),
    Column("confidence", Float, nullable=False),
    Column("mode", Text, nullable=False),
    Column("reasons", JSONB, nullable=False),
    Column("status", Text, nullable=False, index=True),
    Column("requested_at", DateTime(timezone=True), nullable=False),
    Column("decided_by", Text),
    Column("decided_role", Text),
    Column("decided_at", DateTime(timezone=True)),
    Column("note", Text),
    Column("seq", BigInteger, nullable=False),
)

tokens = Table(
    "tokens",
    metadata,
    Column("token_id", Text, primary_key=True),
    Column("holder", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("sha256", Text, nullable=False, unique=True),
    Column("created_by", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("revoked", Boolean, nullable=False),
    Column("seq", BigInteger, nullable=False),
    # A join token's limits (token.created; None: none) and its uses so far (token.used).
    Column("expires_at", DateTime(timezone=True), nullable=True),
    Column("max_uses", Integer, nullable=True),
    Column("uses", Integer, nullable=False, server_default="0"),
)

# The gateway's own state, not folded from the log (issue 45, sessions that end): `projection
# rebuild` leaves these alone. Kept in Postgres, not in a gateway's memory, so every replica of
# the gateway sees the same sessions, sign-outs and sign-ins at once.

# A console session: the browser's cookie holds a random id, this row only its SHA-256 (a
# database dump holds no usable session). Idle and absolute expiry are checked against
# last_seen_at and created_at with the database's clock (one clock for every replica).
console_sessions = Table(
    "console_sessions",
    metadata,
    Column("sha256", Text, primary_key=True),
    Column("session_id", Text, nullable=False, unique=True),  # public: safe to log and list
    Column("name", Text, nullable=False),
    Column("role", Text, nullable=False),
    # How the browser signed in: 'token' (a person's API token: revoking it ends the session),
    # 'login-link' (the home's one-time login URL) or 'oidc' (the site's OpenID provider).
    Column("via", Text, nullable=False),
    Column("token_id", Text, nullable=True),
    # The person's identity at the OpenID provider: '<issuer>#<sub>' (None: not signed in there).
    Column("identity", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("last_seen_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=True, index=True),
    Column("ended_why", Text, nullable=True),
    # The ID token of a sign-in at the OpenID provider, for the provider's sign-out
    # (id_token_hint): sealed (AES-GCM) with a key derived from the cookie's secret, which only
    # the browser holds, so a database dump cannot read it; cleared when the session ends.
    Column("id_token_sealed", Text, nullable=True),
)

# A sign-in at the OpenID provider under way: what the callback needs (PKCE verifier, nonce),
# keyed by the SHA-256 of its `state`, taken once (DELETE ... RETURNING) by whichever replica
# the browser comes back to.
oidc_logins = Table(
    "oidc_logins",
    metadata,
    Column("state_sha256", Text, primary_key=True),
    Column("verifier", Text, nullable=False),
    Column("nonce", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, index=True),
)

# When each token was last used, as the gateways saw it (at most one write per token and
# replica a minute): `hpc-ds1 token list` shows it. Not an event: one per API call would drown
# the log.
token_activity = Table(
    "token_activity",
    metadata,
    Column("token_id", Text, primary_key=True),
    Column("last_used_at", DateTime(timezone=True), nullable=False),
)

# Everything `projection rebuild` empties and refills from the log (order: safe to truncate).
READ_MODELS: tuple[Table, ...] = (
    events,
    gaps,
    set_aside,
    devices,
    tasks,
    measurements,
    models,
    evaluations,
    decisions,
    sessions,
    approvals,
    tokens,
)
