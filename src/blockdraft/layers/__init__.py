"""Building blocks shared by targets and drafters: RMSNorm, RoPE, attention, linear layers, vocabulary ops."""
