#!/usr/bin/env bash
# Build gpuyard's image on a machine that cannot pull from a registry:
#   1. a Debian base image from the system's packages (debootstrap + docker import), once;
#   2. the pinned dependencies (deploy/requirements.lock) as wheels in deploy/wheelhouse/,
#      downloaded by pip on this machine for the base image's Python (again when the lock changed);
#   3. deploy/Dockerfile on that base (cached layers: fast when nothing changed).
#
#   deploy/build-images.sh [IMAGE]        (default IMAGE: gpuyard; needs root for debootstrap)
#
# The base includes systemd, so the same image also boots as a test machine for the systemd units.
# Where a registry is reachable, `docker build -f deploy/Dockerfile -t gpuyard .` is enough.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${1:-gpuyard}
BASE=gpuyard-base:bookworm
MIRROR=http://deb.debian.org/debian
PIP=(.venv/bin/python -m pip)
[[ -x .venv/bin/python ]] || PIP=(python3 -m pip)

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    echo "building $BASE with debootstrap (about a minute)" >&2
    rootfs=$(mktemp -d /tmp/gpuyard-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase \
        --include=python3,python3-venv,ca-certificates,systemd,systemd-sysv \
        bookworm "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 \
        || { tail -20 "$rootfs.log" >&2; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
        "$rootfs"/var/lib/apt/lists/* "$rootfs.log"
    tar -c -C "$rootfs" . | docker import -c 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
fi

if ! cmp -s deploy/requirements.lock deploy/wheelhouse/requirements.lock; then
    # Wheels for the base image's Python and glibc (bookworm: 2.36), whatever Python runs here.
    pyver=$(docker run --rm --network none "$BASE" python3 -c \
        'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    abi=cp${pyver/./}
    platforms=()
    for tag in manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 \
        manylinux_2_34 manylinux_2_35 manylinux_2_36; do
        platforms+=(--platform "${tag}_x86_64")
    done
    echo "downloading the pinned wheels for Python $pyver into deploy/wheelhouse/" >&2
    # nkeys is published as source only: built here into a wheel (pure Python, any platform).
    pinned=$(mktemp /tmp/gpuyard-lock.XXXXXX)
    grep -v '^nkeys==' deploy/requirements.lock >"$pinned"
    "${PIP[@]}" download --quiet --disable-pip-version-check --only-binary=:all: \
        --python-version "$pyver" --implementation cp --abi "$abi" --abi abi3 --abi none \
        "${platforms[@]}" --platform any --dest deploy/wheelhouse \
        -r "$pinned" 'setuptools>=68'
    "${PIP[@]}" wheel --quiet --disable-pip-version-check --no-deps --wheel-dir deploy/wheelhouse \
        "$(grep '^nkeys==' deploy/requirements.lock)"
    rm -f "$pinned"
    cp deploy/requirements.lock deploy/wheelhouse/requirements.lock  # (what the wheels are for)
fi

docker build --quiet --network none --build-arg BASE="$BASE" -f deploy/Dockerfile -t "$IMAGE" . >/dev/null
echo "built $IMAGE on $BASE" >&2
