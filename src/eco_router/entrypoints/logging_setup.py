"""Process-wide logging format."""

from __future__ import annotations

import logging

from eco_router.entrypoints.terminal_text import PrintableFormatter

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableFormatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
