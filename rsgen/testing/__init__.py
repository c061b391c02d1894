"""Test support shipped with the package: an offline zoo of tiny random VLMs (`rsgen.testing.zoo`)."""
