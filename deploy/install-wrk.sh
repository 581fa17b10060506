#!/usr/bin/env bash
# wrk, the C HTTP load generator the decide benchmarks use (benchmarks/loadgen.py says why: an
# httpx client on the same 2 cores takes the CPU the server needs). Debian's `wrk` package.
# Idempotent and quiet when present. Not root, or no apt: says so; the benchmarks then fall
# back to httpx and print that they did.
set -euo pipefail
if command -v wrk >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-wrk: wrk is missing and apt-get cannot run here: the benchmarks use httpx (as root: apt-get install wrk)" >&2
  exit 0
fi
echo "install-wrk: installing Debian's wrk for the HTTP benchmarks (apt)"
export DEBIAN_FRONTEND=noninteractive
install() { apt-get install -y -qq --no-install-recommends wrk >/dev/null; }
if ! install && ! { apt-get update -qq >/dev/null && install; }; then
  echo "install-wrk: apt-get install wrk failed: the benchmarks use httpx" >&2
fi
