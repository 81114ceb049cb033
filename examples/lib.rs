//! Runnable examples: `quickstart/main.rs` and `candle_style/main.rs` (feature `python`), and the
//! Python extension module in `python-ext/` (built with maturin).
