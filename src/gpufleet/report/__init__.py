"""Answers from archived runs: which runs a comparison reads (`select.py`), repeats into
intervals, verdicts and the one structured answer, rendered as the terminal table,
summary.md, PNG plots and the self-contained report.html. Reads the archive, writes pages."""
