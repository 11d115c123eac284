//! Benchmark harness (placeholder while the build warms up).
fn main() {}
