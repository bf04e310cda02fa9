"""Example sluicegate declarations and programs."""
