"""The operator's services: what `sluicegate` commands and the inspect server do, with
neither Typer nor Starlette (docs/decisions/ops-services.md).

A command (`sluicegate.ops.cli`) reads its options, calls a service and prints what it
returns; an HTTP handler (`sluicegate.ops.inspect`) reads its request, calls the same
service and answers JSON. Services import only each other and the layers below `ops`
(`tests/unit/test_layering.py`).
"""
