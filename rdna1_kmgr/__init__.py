"""rdna1-kmgr: patch, build, validate and install amdgpu for first-generation RDNA GPUs."""

__version__ = "0.1.0"
