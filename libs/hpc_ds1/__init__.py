"""HPC-DS1: learns each machine from real measurements and tunes HPC jobs one change at a time."""

__version__ = "0.1.0"
