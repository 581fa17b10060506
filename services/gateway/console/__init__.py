"""The console: the page and its live stream (page.py). Who signs in to it is the edge's
(edge/signins.py)."""
