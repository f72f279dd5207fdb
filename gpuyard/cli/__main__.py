import sys

from gpuyard.cli import main

sys.exit(main())
