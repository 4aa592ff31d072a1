"""Sampling parameters, logits → probabilities, and stop conditions."""
