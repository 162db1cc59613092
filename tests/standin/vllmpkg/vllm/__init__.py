"""A stand-in `vllm` package for doctor's import check: the version and the API server's parser, no engine."""

__version__ = "0.25.0+standin"
