"""Drafter training: teacher data from the target, DFlash and DSpark losses, the resumable loop."""
