"""Fine-tuning on D and D': the trainer (CLIP and BLIP recipes), the shard mix, the hinge loss."""
