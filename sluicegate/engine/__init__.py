"""The stream-processing engine: the exactly-once consume-process-produce loop, tasks,
stores, timers, restoration from changelogs, and the injectable clock."""
