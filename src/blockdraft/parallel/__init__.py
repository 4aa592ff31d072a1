"""Tensor parallelism on torch.distributed (gloo on CPU, NCCL on GPU)."""
