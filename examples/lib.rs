//! Runnable examples; see `quickstart/main.rs`.
