"""gradwatch server: ingest PyTorch optimizer telemetry, store it, serve the live dashboard."""

__version__ = "0.1.0"
