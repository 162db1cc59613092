"""The pure core: data, decisions and rendering. Nothing in here performs I/O."""
