"""The built-in benchmarks, each a package registered under `metrale.benchmarks`."""
