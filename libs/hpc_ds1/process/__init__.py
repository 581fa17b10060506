"""How a service runs: the runtime loop (connect, subscribe, wait for a stop, drain), child
processes, leader election among replicas, the exit of a stuck process, and single-flight calls."""
