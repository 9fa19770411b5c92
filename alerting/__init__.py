"""The alerter: consumes detections into Redis live state (and, later, channels)."""
