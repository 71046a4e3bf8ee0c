"""Entrypoints: settings, the composition root, the HTTP app, the worker and the CLI."""
