"""DDTree speculative decoding end to end through kdtree: see README.md and run.py."""
