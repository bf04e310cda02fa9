from sluicegate.ops.cli import main

main()
