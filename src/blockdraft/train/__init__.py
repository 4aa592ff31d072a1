"""Drafter distillation (teacher = the target's own greedy continuations)."""
