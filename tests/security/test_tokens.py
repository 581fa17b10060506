from __future__ import annotations

import dataclasses
import hashlib

import pytest

from hpc_ds1.security.tokens import (
    HOLDER_PATTERN,
    ROLES,
    TOKEN_PATTERN,
    Principal,
    new_token,
    new_token_id,
    role_allows,
    token_hash,
)


def test_tokens_are_fresh_prefixed_and_long() -> None:
    tokens = {new_token() for _ in range(200)}
    assert len(tokens) == 200
    assert all(t.startswith("hds1_") and len(t) >= 5 + 43 for t in tokens)


def test_only_token_shaped_text_is_looked_up() -> None:
    assert all(TOKEN_PATTERN.match(new_token()) for _ in range(50))
    for text in ("", "short", "hds1_" + "a" * 200, "hds1_abc def ghi jkl mno", "hds1_\x00" * 5):
        assert not TOKEN_PATTERN.match(text), text


def test_token_hash_is_sha256_hex() -> None:
    token = new_token()
    assert token_hash(token) == hashlib.sha256(token.encode()).hexdigest()
    assert len(token_hash(token)) == 64 and token not in token_hash(token)


def test_token_ids_are_subject_tokens() -> None:
    ids = {new_token_id() for _ in range(100)}
    assert len(ids) == 100 and all(HOLDER_PATTERN.match(i) for i in ids)
    assert all("." not in i for i in ids)


@pytest.mark.parametrize(
    ("have", "need", "allowed"),
    [
        ("viewer", "viewer", True),
        ("viewer", "engineer", False),
        ("viewer", "admin", False),
        ("engineer", "viewer", True),
        ("engineer", "engineer", True),
        ("engineer", "admin", False),
        ("admin", "viewer", True),
        ("admin", "engineer", True),
        ("admin", "admin", True),
        ("agent", "viewer", False),
        ("agent", "engineer", False),
        ("agent", "agent", True),
        ("admin", "agent", False),
        ("viewer", "agent", False),
        ("boss", "boss", False),
        ("boss", "viewer", False),
    ],
)
def test_role_order(have: str, need: str, allowed: bool) -> None:
    assert role_allows(have, need) is allowed


def test_principal_is_frozen() -> None:
    p = Principal("alice", "engineer", "tok_1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.role = "admin"  # type: ignore[misc]
    assert not hasattr(p, "anonymous")  # no anonymous principal: every call has a token
    assert set(ROLES) == {"viewer", "engineer", "admin", "agent", "join"}
