"""The built-in strategies, one module each; see `offload._registry`."""
