"""Continuous batching: the only place that knows about many requests at once."""
