"""The TypeScript client's browser bundle, which the demo page and the dashboard import.

It is built from `clients/typescript/` and committed (`make ts-bundle`), so serving it needs
no Node.js.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter()

CLIENT_SCRIPT = "eco-router-client.js"


@cache
def _script() -> bytes:
    return (
        resources.files("eco_router.entrypoints.http")
        .joinpath("static", CLIENT_SCRIPT)
        .read_bytes()
    )


@router.get(f"/{CLIENT_SCRIPT}", include_in_schema=False)
async def client_script() -> Response:
    # no-cache: a page never runs a client older than the server it talks to.
    return Response(_script(), media_type="text/javascript", headers={"Cache-Control": "no-cache"})
