"""Stubs generated from proto/charon/v1/limiter.proto and capacity.proto by
``gen_stubs.py`` (checked in; ``tests/test_stubs.py`` fails when they are
not current)."""
