"""What a route handler needs from the app, as Annotated dependencies: the settings, the event
bus and the database engine `create_app` was given (kept on `app.state`). The routers are
module-level (`router = APIRouter(...)` in each module of api/ and edge/), so a handler names
what it uses in its signature instead of closing over a factory's arguments."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import Engine

from hpc_ds1.eventlog.bus import EventBus
from hpc_ds1.settings import Settings


def app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def app_bus(request: Request) -> EventBus:
    bus: EventBus = request.app.state.bus
    return bus


def app_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


SettingsDep = Annotated[Settings, Depends(app_settings)]
BusDep = Annotated[EventBus, Depends(app_bus)]
EngineDep = Annotated[Engine, Depends(app_engine)]
