"""Model building blocks; the tensor-parallel ones shard full checkpoint tensors by rank."""
