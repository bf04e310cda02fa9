"""Admission: the stages that apply each workflow's flow control, the router that moves a
start between them, the decisions they write, and the worker that runs them on the engine."""
