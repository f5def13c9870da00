"""GRPO trainer: runs TRL GRPOTrainer from the config the operator renders (docs/trainer.md)."""
