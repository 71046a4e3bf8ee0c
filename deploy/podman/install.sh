#!/bin/sh
# Installs podman and what the container tests need from Debian's packages, only those missing,
# then checks that podman answers with the project's containers.conf (deploy/podman/containers.conf).
# The machine's own container configuration is never changed.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}
export CONTAINERS_CONF

# dnsname: containers on one network find each other by name (podman 4.3 with CNI).
# mmdebstrap: the stand-in base image, made from Debian's packages (stand-in-base.sh).
packages="podman buildah runc crun fuse-overlayfs slirp4netns uidmap containernetworking-plugins
golang-github-containers-common golang-github-containernetworking-plugin-dnsname conmon catatonit
mmdebstrap"

missing=""
for package in $packages; do
	status=$(dpkg-query -W -f '${Status}' "$package" 2>/dev/null || true)
	case "$status" in
	*" installed") ;;
	*) missing="$missing $package" ;;
	esac
done

if [ -n "$missing" ]; then
	echo "installing:$missing"
	sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	$sudo apt-get update
	# shellcheck disable=SC2086 # one word per package
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
fi

if ! podman info >/dev/null 2>&1; then
	echo "podman is installed but does not answer (CONTAINERS_CONF=$CONTAINERS_CONF):" >&2
	podman info >&2 || true
	exit 1
fi
echo "podman: $(podman --version), CONTAINERS_CONF=$CONTAINERS_CONF"
