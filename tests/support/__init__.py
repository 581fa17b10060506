"""What the tests share, in one place: starting `serve` and waiting for it (serving), running the
CLI (commands), a database of its own (databases), waiting for a condition (waiting), the
streams (streams), and the tiny real measurement set and its model (measured, trained)."""
