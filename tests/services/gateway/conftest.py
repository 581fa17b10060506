"""The gateway tests' fixtures: the role tokens folded into the projection, and the whole app in
process as a viewer. The helpers they use are in tests/support/gateway.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.services.gateway import create_app
from hpc_ds1.settings import Settings
from tests.support.gateway import as_role, asgi_client, fold, role_token_events


@pytest.fixture
async def role_tokens(settings: Settings, bus: EventBus, engine: Engine) -> None:
    await fold(settings, bus, engine, *role_token_events())


@pytest.fixture
async def viewer_client(
    settings: Settings, bus: EventBus, engine: Engine, role_tokens: None
) -> AsyncIterator[httpx.AsyncClient]:
    """The whole gateway app in process, called with a viewer's token."""
    async for http in asgi_client(create_app(settings, bus, engine), headers=as_role("viewer")):
        yield http
