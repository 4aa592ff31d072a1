"""`blockdraft bench`: held-out prompt sets through AR, each drafter and HF transformers."""
