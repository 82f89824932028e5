"""Build hook: generate dra/pb from proto/ before the package's modules are collected."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithProtos(build_py):
    """Generates the gRPC code into the source tree, then builds as usual."""

    def run(self) -> None:
        spec = importlib.util.spec_from_file_location("proto_generate", ROOT / "proto" / "generate.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.generate(ROOT)
        # setuptools listed the packages before dra/pb's subpackages existed: list them again,
        # or a wheel built from a clean tree (pip wheel ., docker build) lacks the gRPC code.
        packages = find_packages(where=str(ROOT), include=["dra*"])
        self.distribution.packages = packages
        self.packages = packages
        super().run()


setup(cmdclass={"build_py": BuildWithProtos})
