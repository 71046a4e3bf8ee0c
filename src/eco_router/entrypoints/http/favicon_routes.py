"""The icon browsers fetch beside every page, so the demo page's requests end without a 404."""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter()


@cache
def _icon() -> bytes:
    return (
        resources.files("eco_router.entrypoints.http")
        .joinpath("static", "favicon.svg")
        .read_bytes()
    )


@router.get("/favicon.ico", include_in_schema=False)
async def favicon() -> Response:
    return Response(
        _icon(), media_type="image/svg+xml", headers={"Cache-Control": "public, max-age=86400"}
    )
