//! Benchmarks for hipdecode: `bench-decode` and the criterion suites.
