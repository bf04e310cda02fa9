"""The `sluicegate` command line: thin commands over `sluicegate.ops.services`.

`root` is the command group, `entry` the script's entry point; each other module holds
one group's commands, sharing the options of `options`."""
