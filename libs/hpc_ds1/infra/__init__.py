"""Embedded NATS and Postgres for the one-command default, and the home directory's owner lock."""
