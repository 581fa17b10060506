"""The projection of the event log into Postgres's read models: the fold (pure: an event to the
writes it makes), the store (the writes applied, checkpoint in the same transaction) and the
rebuild. The projector service runs them live."""
