"""Print gpuyard's runtime dependencies pinned to the versions installed here (the tested ones).

    .venv/bin/python deploy/lock.py > deploy/requirements.lock

The Dockerfile installs exactly these; `deploy/build-images.sh` downloads them as wheels for an
offline build. Test-only extras are left out. Run it with the Python of the image's base (the
header records it): some pins depend on the Python version.
"""

from __future__ import annotations

import sys
from importlib.metadata import distribution

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HEADER = """\
# gpuyard's runtime dependencies, pinned to the versions its tests ran with, for Python {python}
# (some pins differ on another Python): the Python of deploy/Dockerfile's default base image and
# of the Debian base deploy/build-images.sh builds; tests/test_deploy_configs.py checks they agree.
# Installed by deploy/Dockerfile (from deploy/wheelhouse/ when deploy/build-images.sh filled it).
# Refresh in a venv of that Python, installed as the README says (-c requirements-lock.txt):
#   .venv/bin/python deploy/lock.py > deploy/requirements.lock
# For another Python, change the base images first, then refresh in a venv of the new Python.
"""


def runtime_closure(package: str = "gpuyard") -> dict[str, tuple[str, str]]:
    """{canonical name: (name, installed version)} of everything `pip install package` needs."""
    found: dict[str, tuple[str, str]] = {}
    todo = list(distribution(package).requires or [])
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra (tests) or another platform's dependency
        key = canonicalize_name(req.name)
        if key in found:
            continue
        dist = distribution(req.name)
        found[key] = (dist.metadata["Name"], dist.version)
        todo += dist.requires or []
    return found


def main() -> None:
    print(HEADER.format(python=f"{sys.version_info[0]}.{sys.version_info[1]}"), end="")
    for _, (name, version) in sorted(runtime_closure().items()):
        print(f"{name}=={version}")


if __name__ == "__main__":
    main()
