#!/usr/bin/env bash
# Build the CPU image here, end to end, with podman: where no image registry is reachable (python:3.11-slim and
# nvidia/cuda cannot be pulled), the base is made from Debian's own packages with debootstrap (once, then kept as
# a local image), and the project's Dockerfile is built on it, torch's wheel taken from the host's folder of wheels
# instead of PyTorch's index. Elsewhere, `docker build .` builds the same file with its default bases.
#
#   scripts/build_image.sh            builds localhost/serverless-triton:cpu (IMAGE to name it otherwise)
#   Environment: IMAGE; BASE_IMAGE (default localhost/serverless-triton-base:bookworm); DEBIAN_MIRROR (default: the
#   host's apt mirror); TORCH_WHEELS (default /opt/wheels: a folder holding torch's CPU wheel for Python 3.11,
#   mounted into the build; empty: PyTorch's CPU index, as the Dockerfile's default).
#
# Podman needs the runc runtime here (crun refuses this host's hybrid cgroups) and ulimits at or under the host's
# (the host withholds CAP_SYS_RESOURCE); `--network host` reaches the package registries, and the host's CA bundle
# is mounted for HTTPS. Installs what it needs (podman, runc, debootstrap) from Debian's packages when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/serverless-triton:cpu}
BASE_IMAGE=${BASE_IMAGE:-localhost/serverless-triton-base:bookworm}
TORCH_WHEELS=${TORCH_WHEELS-/opt/wheels}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

missing=()
for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "build_image: installing ${missing[*]} (and what podman needs) from Debian's packages" >&2
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends podman runc debootstrap uidmap \
    slirp4netns fuse-overlayfs containernetworking-plugins >/dev/null
fi

# what runc could set here (the host's own limits were refused for the build's processes)
limits=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
podman=(podman --runtime runc)

started=$(date +%s)
if ! "${podman[@]}" image exists "$BASE_IMAGE"; then
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  echo "build_image: making the Debian base $BASE_IMAGE from $DEBIAN_MIRROR (once)" >&2
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd bookworm "$rootfs" \
    "$DEBIAN_MIRROR" >/dev/null
  tar -C "$rootfs" -c . | "${podman[@]}" import --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
fi

# FLAVOR given, not defaulted: podman 4.3 follows a stage named through a build argument (FROM base-${FLAVOR})
# only when the argument is given
build_args=(--build-arg FLAVOR=cpu --build-arg "BASE_CPU=$BASE_IMAGE")
volumes=(-v /etc/ssl/certs:/etc/ssl/certs:ro)
if [ -n "$TORCH_WHEELS" ]; then
  build_args+=(--build-arg TORCH_INDEX_CPU= --build-arg TORCH_FIND_LINKS=/torch-wheels)
  volumes+=(-v "$TORCH_WHEELS:/torch-wheels:ro")
fi
# docker's format keeps HEALTHCHECK and STOPSIGNAL (OCI's has no HEALTHCHECK)
"${podman[@]}" build --format docker --network host "${limits[@]}" "${volumes[@]}" "${build_args[@]}" \
  -t "$IMAGE" .
echo "build_image: built $IMAGE in $(( $(date +%s) - started )) s; $("${podman[@]}" image inspect "$IMAGE" \
  --format '{{.Size}}') bytes" >&2
