"""gpuprov: GPU node provisioning and bootstrap."""

__version__ = "0.1.0"
