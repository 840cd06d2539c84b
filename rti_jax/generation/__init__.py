"""Generation backends: in-process JAX sampler (default) and SGLang over HTTP."""
