#!/usr/bin/env bash
# Set up a fresh Debian machine (as root) to run and test runtime-proxy:
# containerd + runc (the real backend), busybox-static (test images),
# docker-registry + skopeo (a loopback registry so PullImage is real),
# systemd (systemd-analyze checks the unit files), iproute2 (`ip`: the
# metrics tests' network namespace; `unshare` is util-linux's, essential),
# python3 with venv, and a virtualenv with the project installed. Safe to
# run again.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(python3 python3-venv containerd runc busybox-static docker-registry skopeo systemd iproute2)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # The tests run their own loopback registry; Debian's system one is not wanted.
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
        systemctl disable --now docker-registry >/dev/null 2>&1 || true
    fi
fi

# A venv made before python3-venv was there has python but no pip: make it again.
if [ ! -x .venv/bin/python ] || [ ! -x .venv/bin/pip ]; then
    python3 -m venv --clear .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
echo "setup: ready (.venv)" >&2
