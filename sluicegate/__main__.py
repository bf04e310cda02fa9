# The signals are kept before anything else is imported (sluicegate/ops/signals.py).
from sluicegate.ops.cli.entry import main

main()
