"""Across hosts and over time: the archive's index (SQLite, rebuilt from the run files),
the fleet's outliers, each host's history, and the figures as OpenMetrics."""
