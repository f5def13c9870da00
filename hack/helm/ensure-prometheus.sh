#!/usr/bin/env bash
# Makes sure `prometheus` and `promtool` (Debian's `prometheus` package) are on PATH: the chart tests
# check the alert rules with promtool and scrape the operator and a CPU trainer run with a real server.
# Installs the package with apt-get when it is missing and stops the service the package starts, so the
# tests' own server (temporary storage, localhost targets) is the only one running.
#
# Usage: hack/helm/ensure-prometheus.sh   (idempotent; prints the promtool version)
set -euo pipefail

if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  promtool --version 2>&1 | head -1
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "promtool/prometheus not found and apt-get is not available: install Prometheus >= 2.42" \
       "(it must provide 'prometheus' and 'promtool' on PATH) and rerun." >&2
  exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "installing the 'prometheus' package needs root: run 'apt-get install -y prometheus' as root" >&2
    exit 1
  fi
fi

echo "[ensure-prometheus] installing Debian's 'prometheus' package (provides prometheus and promtool)" >&2
# policy-rc.d exit 101 tells invoke-rc.d not to start the packaged service during the install.
POLICY=/usr/sbin/policy-rc.d
CREATED_POLICY=0
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod +x "$POLICY"
  CREATED_POLICY=1
fi
cleanup() { if [ "$CREATED_POLICY" = 1 ]; then $SUDO rm -f "$POLICY"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y --no-install-recommends prometheus >&2; then
  $SUDO apt-get update >&2
  $SUDO apt-get install -y --no-install-recommends prometheus >&2
fi
# On machines with systemd the unit may still be enabled; the tests never need it.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
promtool --version 2>&1 | head -1
