"""The C part of the package: the codec's hot loops (sluicegate/schemas/_speedups.c).

Everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("sluicegate.schemas._speedups", ["sluicegate/schemas/_speedups.c"],
              extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                  "-Wno-missing-field-initializers"]),
])
