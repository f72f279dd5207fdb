"""`python -m gpuyard.services.simclock`: run the simclock service on its own."""

from gpuyard.services.simclock.service import SimClock, SimClockConfig
from gpuyard.shared.service import run_service

if __name__ == "__main__":
    run_service(SimClock, SimClockConfig)
