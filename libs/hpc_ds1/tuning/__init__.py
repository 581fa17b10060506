"""Tuning a job one change at a time, as pure rules over events: `session` folds a tuning
session's events and decides its next step. The coordinator drives live sessions with it and
the evaluation replays recorded ones with the same rules, so the two cannot disagree.
`knobs`: any job's knobs and constraints (parsed safely), the valid configurations, their moves.
`recorded`: a brute-forced Kernel Tuner / T4 cache replayed as a device (recorded repeats)."""
