#!/usr/bin/env bash
# The browser the console's tests drive: Debian's `chromium` package at /usr/bin/chromium
# (Playwright from pip drives it through executable_path; `playwright install`, a browser
# download, does not work on these machines). Idempotent and quiet when it is already there.
# Not root, or no apt: says so and leaves it; the browser tests then skip with that reason.
set -euo pipefail
BROWSER=/usr/bin/chromium
if [ -x "$BROWSER" ]; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "install-browser: $BROWSER is missing and this is not root: the console's browser tests will skip (as root: apt-get install chromium)" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-browser: $BROWSER is missing and there is no apt-get: the console's browser tests will skip" >&2
  exit 0
fi
echo "install-browser: installing Debian's chromium for the console's browser tests (apt)"
export DEBIAN_FRONTEND=noninteractive
install() { apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
if ! install && ! { apt-get update -qq >/dev/null && install; }; then
  echo "install-browser: apt-get install chromium failed: the console's browser tests will skip" >&2
  exit 0
fi
"$BROWSER" --version 2>/dev/null || echo "install-browser: $BROWSER does not run: the console's browser tests will fail or skip" >&2
