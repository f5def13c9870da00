"""grpo-operator: run GRPO fine-tuning of language models as a Kubernetes custom resource."""

__version__ = "0.1.0"
