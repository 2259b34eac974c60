"""DDTree speculative decoding end to end through kdtree (issue 10): see run.py and README.md."""
