"""The Faust stream worker: per-job windows in tables, detectors on every step."""
