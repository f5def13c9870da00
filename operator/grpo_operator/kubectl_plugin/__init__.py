"""``kubectl grpo``: a kubectl plugin that shows a GRPOJob's status, samples, rewards and checkpoints,
copies its model out of the job's volume, reads its pods' logs and suspends or resumes it.

Layout: ``cli`` (one function per subcommand, ``main`` mapping errors to exit codes) uses ``arguments``
(the command line and its help), ``output`` (every printed line, control characters escaped), ``tail``
(bounded reads of the trainer's JSON-lines files), ``kube`` (Kubernetes API access and permission
checks), ``volume`` (reading the job's claim through a short-lived reader pod) and the pure ``data``
(parsing what the trainer writes) and ``render`` (terminal text) modules.
"""
