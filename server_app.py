"""Flower ServerApp entry point (``serverapp`` component in pyproject.toml)."""

from pathlib import Path

from fedgraph_flwr.engine.server_app import make_server_app

# The app folder: its pyproject.toml declares the run config's defaults.
app = make_server_app(app_dir=Path(__file__).resolve().parent)
