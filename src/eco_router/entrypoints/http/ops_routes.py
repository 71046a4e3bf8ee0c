"""Liveness and readiness, with each check's cause on the ops port (`router`) and without it
on the public one (`public_router`), and metrics (`metrics_router`, included where exposed)."""

from __future__ import annotations

from typing import Any

from dependency_injector.wiring import Provide, inject
from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from eco_router.application.check_readiness import CheckReadiness, is_ready, public_checks
from eco_router.entrypoints.container import Container

router = APIRouter()
public_router = APIRouter()
metrics_router = APIRouter()


@router.get("/health")
@public_router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready")
@inject
async def ready(
    check: CheckReadiness = Depends(Provide[Container.check_readiness]),  # noqa: B008
) -> JSONResponse:
    return readiness_response(await check())


@public_router.get("/ready")
@inject
async def public_ready(
    check: CheckReadiness = Depends(Provide[Container.check_readiness]),  # noqa: B008
) -> JSONResponse:
    return readiness_response(public_checks(await check()))


@metrics_router.get("/metrics")
@inject
async def metrics(
    registry: CollectorRegistry = Depends(Provide[Container.metrics_registry]),  # noqa: B008
) -> Response:
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def readiness_response(checks: dict[str, Any]) -> JSONResponse:
    ready = is_ready(checks)
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)
