"""The weight broadcast from trainer rank 0 to every worker of every vLLM replica: the group both sides join
(group.py, torch only) and the vLLM plugin that joins it from vLLM's workers (plugin.py, vllm_engine.py)."""
