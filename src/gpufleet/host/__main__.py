"""Entry point of the zipapp: `python agent.pyz VERB`, the verb's JSON arguments on stdin."""

import sys

from gpufleet.host.dispatch import main

sys.exit(main(sys.argv[1:]))
