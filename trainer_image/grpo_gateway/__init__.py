"""The rollout gateway of a client-rollout GRPOJob (spec.rollouts.source: Client).

A small CPU process, run as ``python -m grpo_gateway`` in Deployment ``<job>-rollouts``, that outlives the
trainer gang's restarts. On the client port it speaks the protocol of arbor-ai 0.2.17's DSPy provider
(``fine_tuning/grpo/*``) and OpenAI-compatible completions; on the internal port it hands the client's
scored groups to trainer rank 0 and takes the trainer's progress. See docs/dspy.md.
"""
