"""Ray actor classes of ray_ckpt: thin wrappers around the plain classes in ray_ckpt.

This folder is installed as ``ray_ckpt.actors`` (pyproject.toml maps it); it is never a package
of its own, so a user's own ``actors`` module or package is never shadowed by it, nor it by one.
"""

if __name__ != "ray_ckpt.actors":
    raise ImportError(
        f"ray_ckpt's actors are imported as ray_ckpt.actors, not as {__name__!r}: install ray_ckpt "
        "(pip install -e .) and import ray_ckpt.actors"
    )
