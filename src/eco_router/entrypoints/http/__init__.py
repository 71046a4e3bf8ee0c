"""The FastAPI application."""
