"""Ray actor classes of ray_ckpt: thin wrappers around the plain classes in ray_ckpt."""
