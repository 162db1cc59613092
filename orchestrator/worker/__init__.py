"""Code that runs on the GPU host through `python -m` (staging weights); stdlib + huggingface_hub only."""
