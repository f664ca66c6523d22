"""The archive under `logs/`: every path in it (`layout.py`), runs written atomically with
checksums and verified (`store.py`), files received as they arrive, bounded, holes kept
(`incoming.py`), the manifest built from what was launched, and the typed records every
reader gets back (`records.py`: runs, sweeps, tunes, find-max, health)."""
