"""The gateway's HTTP API for people and their tools: decisions, sessions, tasks, devices, the
model, measurements, the audit and the evaluation; a module-level router each."""
