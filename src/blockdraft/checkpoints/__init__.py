"""Checkpoint files and the spellings every model shares: safetensors and sharded indexes, GGUF, MXFP4,
per-expert tensors, the Hugging Face keys all decoders spell alike, and the drafter config resolver.
A target family's own config keys and tensor names live in its file under `models/families/`."""
