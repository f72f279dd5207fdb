"""`python -m gpuyard.services.scheduler`: run the scheduler service on its own."""

from gpuyard.services.scheduler.service import Scheduler, SchedulerConfig
from gpuyard.shared.service import run_service

if __name__ == "__main__":
    run_service(Scheduler, SchedulerConfig)
