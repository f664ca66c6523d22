"""`python -m gpufleet ...` is the `gpufleet` console script."""

from gpufleet.cli.console import main

main()
