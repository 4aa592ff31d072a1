"""Drafter kinds, one file each (DFlash, DFlash2, DSpark), behind `registry.py`.

A kind owns its config checks, heads, proposal rule (and candidate lattice), publish layout, ONNX export,
tensor-parallel and training hooks, all in the `DrafterKind` record its file exports (`kind.py`).
"""
