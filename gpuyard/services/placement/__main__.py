"""`python -m gpuyard.services.placement`: run the placement service on its own."""

from gpuyard.services.placement.service import Placement, PlacementConfig
from gpuyard.shared.service import run_service

if __name__ == "__main__":
    run_service(Placement, PlacementConfig)
