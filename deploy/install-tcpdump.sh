#!/usr/bin/env bash
# Debian's tcpdump for the fleet's end-to-end TLS test (tests/fleet_e2e: a capture on a device's
# link while it joins and runs a task must show no token; issue 45). Idempotent and quiet when it
# is already there. Not root, or no apt: says so, prints "skipped" and exits 0; that test then
# skips with that reason (the fleet tests need root for their namespaces anyway).
set -euo pipefail
if command -v tcpdump >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "install-tcpdump: skipped: tcpdump missing and this is not root: the capture test will skip (as root: apt-get install tcpdump)" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-tcpdump: skipped: tcpdump missing and there is no apt-get: the capture test will skip" >&2
  exit 0
fi
echo "install-tcpdump: installing Debian's tcpdump for the fleet's TLS capture test (apt)"
export DEBIAN_FRONTEND=noninteractive
# Another apt run (a second helper, unattended upgrades) holds the lock for a while: wait for it.
install() { apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends tcpdump >/dev/null; }
if ! install && ! { apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null && install; }; then
  echo "install-tcpdump: skipped: apt-get install tcpdump failed: the capture test will skip" >&2
  exit 0
fi
