"""The machine a job runs on: its hardware fingerprint, the CPUs an allocation grants, the lock
that keeps two measurements off one device, the marks a running job leaves, and the host's home."""
