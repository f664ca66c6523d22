"""`python -m gpufleet ...` is the `gpufleet` console script."""

from gpufleet.cli import main

main()
