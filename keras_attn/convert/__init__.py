"""Importing public checkpoints (Hugging Face safetensors)."""
