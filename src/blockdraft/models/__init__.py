"""Pure nn.Modules: the target decoder (Llama, Qwen3) and the block drafters."""
