"""Plugging ray_ckpt into the checkpoint seams of training frameworks.

Each integration is a module of its own, imported by name (``ray_ckpt.integrations.dcp``);
importing this package loads none of them, and no integration imports a framework it does not
plug into.
"""
