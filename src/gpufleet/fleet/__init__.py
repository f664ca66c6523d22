"""Across hosts and over time: the archive's index of per-run summaries (`index.py`,
SQLite, rebuilt from the run files whenever they change), the fleet view that names a host
off the fleet's median (`outliers.py`, with what differs on it), each host's history
against its settled past (`history.py`), both on compare's statistics with the requests'
spread for single runs (`estimate.py`), the fleet's table, plot and page (`page.py`), and
the figures as Prometheus exposition (`openmetrics.py`)."""
