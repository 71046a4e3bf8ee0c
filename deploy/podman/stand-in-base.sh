#!/bin/sh
# Makes the images the container tests build on where no image registry is reachable, from
# Debian's packages alone:
#   localhost/eco-router-base:bookworm   python3 (3.11) with venv and pip, ca-certificates,
#                                         passwd: enough for the Dockerfile's two stages
#   localhost/eco-router-redis:bookworm  Debian's redis-server on that base (redis.Containerfile)
# An image already present is kept; --rebuild makes both again. DEBIAN_MIRROR picks the mirror.
# They stand in for python:3.11-slim-bookworm and redis:7.2-bookworm; releases use those.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}
export CONTAINERS_CONF

BASE_IMAGE=${BASE_IMAGE:-localhost/eco-router-base:bookworm}
REDIS_IMAGE=${REDIS_IMAGE:-localhost/eco-router-redis:bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_SECURITY=${DEBIAN_SECURITY:-http://deb.debian.org/debian-security}

rebuild=false
[ "${1:-}" = --rebuild ] && rebuild=true

present() { podman image exists "$1" && [ "$rebuild" = false ]; }

if present "$BASE_IMAGE"; then
	echo "stand-in base: $BASE_IMAGE (kept)"
else
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	# python-is-python3: the Dockerfile calls `python`, as the official image names it.
	mmdebstrap --variant=minbase --quiet \
		--include=python3,python-is-python3,python3-venv,python3-pip-whl,python3-setuptools-whl,ca-certificates,passwd \
		bookworm "$work/rootfs.tar" \
		"deb $DEBIAN_MIRROR bookworm main" \
		"deb $DEBIAN_MIRROR bookworm-updates main" \
		"deb $DEBIAN_SECURITY bookworm-security main" </dev/null
	podman import --quiet --change 'CMD ["/bin/bash"]' "$work/rootfs.tar" "$BASE_IMAGE" >/dev/null
	rm -rf "$work"
	trap - EXIT
	echo "stand-in base: $BASE_IMAGE (made)"
fi

if present "$REDIS_IMAGE"; then
	echo "stand-in redis: $REDIS_IMAGE (kept)"
else
	podman build --quiet --tag "$REDIS_IMAGE" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
		--file "$here/redis.Containerfile" "$here" >/dev/null
	echo "stand-in redis: $REDIS_IMAGE (made)"
fi
