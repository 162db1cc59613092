"""A local HTTP server speaking the part of the Hugging Face Hub API that huggingface_hub uses."""

from .models import safetensors_bytes, sharded_model, single_file_model
from .server import HubStub, Request, StubFile, StubRepo

__all__ = ["HubStub", "Request", "StubFile", "StubRepo", "safetensors_bytes", "sharded_model", "single_file_model"]
