"""Reports of a run: predicted time tables and their plots."""
