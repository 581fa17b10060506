"""The fleet: devices that join over HTTP, per-device task queues and liveness, placement."""
