"""`python -m gpufleet ...` is the `gpufleet` console script."""

from gpufleet.cli.main import main

main()
