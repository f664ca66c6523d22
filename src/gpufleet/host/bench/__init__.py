"""The load generator and its metrics. Ships inside the host agent: stdlib at import time."""
