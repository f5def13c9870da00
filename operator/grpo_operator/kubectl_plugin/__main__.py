import sys

from grpo_operator.kubectl_plugin.cli import main

sys.exit(main())
