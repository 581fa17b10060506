"""`hpc-ds1 token login`: a fresh one-time login URL, kept only as a hash in the home."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
from pathlib import Path

from hpc_ds1.security.credentials import consume_login_token
from tests.support.commands import HPC_DS1


def login(home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_DS1_")}
    env.update(HPC_DS1_HOME=str(home), HPC_DS1_PORT="8999")
    return subprocess.run(
        [HPC_DS1, "token", "login"], env=env, capture_output=True, text=True, timeout=60
    )


def test_token_login_prints_a_url_that_works_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = login(home)
    assert first.returncode == 0, first.stderr
    url = re.search(r"^http://127\.0\.0\.1:8999/\?token=(hds1_\S+)$", first.stdout, re.MULTILINE)
    assert url, first.stdout
    token = url.group(1)
    stored = home / "credentials" / "login.sha256"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert stored.read_text().strip() == hashlib.sha256(token.encode()).hexdigest()
    assert token not in stored.read_text()

    # A new URL replaces the old one; each works once.
    second = login(home)
    newer = re.search(r"\?token=(hds1_\S+)", second.stdout)
    assert newer and newer.group(1) != token
    assert not consume_login_token(home, token)
    assert consume_login_token(home, newer.group(1))
    assert not consume_login_token(home, newer.group(1))
