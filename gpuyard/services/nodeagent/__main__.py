"""`python -m gpuyard.services.nodeagent`: run a node agent (same options as `gpuyard nodeagent`)."""

import sys

from gpuyard.services.nodeagent.run import main

if __name__ == "__main__":
    sys.exit(main())
