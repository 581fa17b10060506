"""The agent transport: what a device's agent sends and fetches over HTTP (routes.py), the
long-poll bridge to each device's work queue (bridge.py), the bodies (bodies.py) and the
plausibility of what a device claims (plausibility.py)."""
