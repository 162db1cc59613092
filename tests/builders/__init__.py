"""Builders the tests and the benchmarks share (configs, probers), so bench/ imports no test module."""
