#!/usr/bin/env bash
# Local stand-ins for the three public base images, for hosts that reach no image registry.
#
#   compose/build_base_images.sh            # build what is missing (cached by tag), print the env
#   eval "$(compose/build_base_images.sh)"  # ...and point the compose file at them
#
# Each image is made from Debian's own packages: `debootstrap --variant=minbase bookworm` from the
# Debian mirror apt already uses, imported as a root file system, then python3.11, redis-server
# and nginx installed on top with apt. An image whose tag exists is never rebuilt; delete the tag
# (docker rmi) to rebuild it. Progress goes to stderr, the variables to stdout.
set -euo pipefail

SUITE=${PAGEDSERVE_BASE_SUITE:-bookworm}
PREFIX=${PAGEDSERVE_BASE_PREFIX:-pagedserve-base}
DEBIAN_IMAGE="$PREFIX/debian:$SUITE"
PYTHON_IMAGE="$PREFIX/python:3.11-$SUITE"
REDIS_IMAGE="$PREFIX/redis:7-$SUITE"
LB_IMAGE="$PREFIX/nginx:$SUITE"

log() { echo "[base-images] $*" >&2; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# The first Debian (not -security, not -updates) mirror in apt's sources, one-line or deb822.
debian_mirror() {
    if [[ -n "${PAGEDSERVE_DEBIAN_MIRROR:-}" ]]; then echo "$PAGEDSERVE_DEBIAN_MIRROR"; return; fi
    local mirror
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -n1 | tr -d ' ')
    echo "${mirror:-http://deb.debian.org/debian}"
}

build_debian() {
    have_image "$DEBIAN_IMAGE" && { log "$DEBIAN_IMAGE cached"; return; }
    command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >&2
    local root mirror
    root=$(mktemp -d /var/tmp/pagedserve-rootfs.XXXXXX)
    mirror=$(debian_mirror)
    log "debootstrap --variant=minbase $SUITE from $mirror (a few minutes)"
    if debootstrap --variant=minbase "$SUITE" "$root" "$mirror" >&2; then
        rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
        tar -C "$root" -c . | docker import \
            --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'CMD ["bash"]' - "$DEBIAN_IMAGE" >&2
    fi
    rm -rf "$root"
    have_image "$DEBIAN_IMAGE" || { log "debootstrap of $SUITE failed"; exit 1; }
}

# docker build of a tiny Dockerfile (read from stdin) on top of the Debian image.
build_on_debian() {
    local tag=$1
    have_image "$tag" && { log "$tag cached"; return; }
    log "building $tag"
    docker build --build-arg "BASE=$DEBIAN_IMAGE" -t "$tag" - >&2
}

build_python() {
    # A venv first on PATH gives `python` and a `pip` that may install (PEP 668 forbids the
    # system one), as in the public python image.
    build_on_debian "$PYTHON_IMAGE" <<'EOF'
ARG BASE
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
        ca-certificates \
    && rm -rf /var/lib/apt/lists/* && python3.11 -m venv /usr/local/python
ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["python3"]
EOF
}

build_redis() {
    build_on_debian "$REDIS_IMAGE" <<'EOF'
ARG BASE
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends redis-server redis-tools \
    && rm -rf /var/lib/apt/lists/*
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "no"]
EOF
}

build_lb() {
    # wget for the compose health check, as in the alpine image (busybox).
    build_on_debian "$LB_IMAGE" <<'EOF'
ARG BASE
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends nginx wget \
    && rm -rf /var/lib/apt/lists/* \
    && ln -sf /dev/stdout /var/log/nginx/access.log && ln -sf /dev/stderr /var/log/nginx/error.log
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
EOF
}

main() {
    docker info >/dev/null 2>&1 || { log "no Docker engine answers (start dockerd)"; exit 1; }
    build_debian
    build_python
    build_redis
    build_lb
    echo "export PAGEDSERVE_PYTHON_IMAGE=$PYTHON_IMAGE"
    echo "export PAGEDSERVE_REDIS_IMAGE=$REDIS_IMAGE"
    echo "export PAGEDSERVE_LB_IMAGE=$LB_IMAGE"
}

main "$@"
