"""Benchmark harness: runs workflows on backends and reports the seed's table."""

from __future__ import annotations
