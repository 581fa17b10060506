"""The append-only event log on NATS JetStream: the bus, its subjects, the audit stream's reader,
idempotency (a retried append or request answered once) and the claims that let one replica
answer a keyed request."""
