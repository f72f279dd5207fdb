"""`python -m gpuyard.services.admission`: run the admission service on its own."""

from gpuyard.services.admission.service import Admission, AdmissionConfig
from gpuyard.shared.service import run_service

if __name__ == "__main__":
    run_service(Admission, AdmissionConfig)
