"""The C part of the package: the codec's hot loops (sluicegate/schemas/_speedups.c).

Optional: where it does not compile (no C compiler), the package installs without it and
runs the same code in Python at several times the CPU, and a worker says so when it
starts (docs/decisions/optional-extension.md). The wheel CI builds always carries it.

Everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("sluicegate.schemas._speedups", ["sluicegate/schemas/_speedups.c"],
              optional=True,
              extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                  "-Wno-missing-field-initializers"]),
])
