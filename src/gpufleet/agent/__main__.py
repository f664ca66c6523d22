"""Entry point of the zipapp: `python agent.pyz VERB BASE64-JSON-ARGS`."""

import sys

from gpufleet.agent.main import main

sys.exit(main(sys.argv[1:]))
