"""Builds the compiled GF(2^8) kernel; all other metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ray_ckpt.core._gf256",
            sources=["ray_ckpt/core/_gf256.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra"],
        )
    ]
)
