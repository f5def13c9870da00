import sys

from grpo_trainer.main import main

sys.exit(main(sys.argv[1:]))
