"""Tokens for the end-to-end tests: every HTTP call carries one (there is no anonymous reader)."""

from __future__ import annotations

from typing import Literal

from hpc_ds1.events import TokenCreated, envelope, new_id
from hpc_ds1.security.tokens import new_token, token_hash
from hpc_ds1.stack import Stack

Role = Literal["viewer", "engineer", "admin", "agent"]


async def grant(stack: Stack, role: Role, holder: str | None = None) -> str:
    """A new token of `role`, registered and folded into the projection."""
    token = new_token()
    event = TokenCreated(
        token_id=new_id(), holder=holder or f"e2e-{role}", role=role, sha256=token_hash(token)
    )
    await stack.bus.publish(
        envelope(event, actor="admin", source="test", prefix=stack.settings.subject_prefix)
    )
    await stack.caught_up()
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
