"""Across hosts and over time: the archive's index of per-run summaries (`index.py`,
SQLite, rebuilt from the run files whenever they change, damaged runs kept aside by name),
the fleet view that names a host off the fleet's median (`outliers.py`: a field differs or
a second round agrees, else a suspect), the words for it (`wording.py`: what differs on
every host), each host's history against its settled past (`history.py`), both on
compare's statistics with a run-to-run term for single runs (`estimate.py`), the fleet's
table, plot and page (`page.py`), and the figures as Prometheus exposition
(`openmetrics.py`)."""
