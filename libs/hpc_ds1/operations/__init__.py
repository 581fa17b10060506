"""Operating a site: backups of the log and the projection, and the archive of old events."""
