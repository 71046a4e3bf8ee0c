"""What the demo page and the dashboard load beside themselves: the TypeScript client's browser
bundle, and the demo page's two small fonts (with their licence).

The bundle is built from `clients/typescript/` and committed (`make ts-bundle`), so serving it
needs no Node.js; the fonts are made by `make demo-fonts` (tools/demo_fonts.py).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

router = APIRouter()

CLIENT_SCRIPT = "eco-router-client.js"
# The demo's answers hold Hangul and emoji, which default fonts lack (DejaVu, Liberation).
FONTS = {
    "demo-hangul.ttf": "font/ttf",
    "demo-emoji.ttf": "font/ttf",
    "demo-fonts-LICENSE.txt": "text/plain; charset=utf-8",
}


@cache
def _static(name: str) -> bytes:
    return resources.files("eco_router.entrypoints.http").joinpath("static", name).read_bytes()


@router.get(f"/{CLIENT_SCRIPT}", include_in_schema=False)
async def client_script() -> Response:
    # no-cache: a page never runs a client older than the server it talks to.
    return Response(
        _static(CLIENT_SCRIPT), media_type="text/javascript", headers={"Cache-Control": "no-cache"}
    )


@router.get("/fonts/{name}", include_in_schema=False)
async def font(name: str) -> Response:
    media_type = FONTS.get(name)
    if media_type is None:
        raise HTTPException(404, "no such font")
    return Response(
        _static(name), media_type=media_type, headers={"Cache-Control": "public, max-age=86400"}
    )
