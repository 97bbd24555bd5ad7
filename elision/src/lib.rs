//! Elision: what the model sees of large and failed tool results.
//!
//! Not built yet. This crate will own the cheap token estimator, thresholds validated at
//! build time, the batch elision plan, head+tail previews with a handle and guidance, and
//! failure truncation, exposed through `psych_types::ResultProjector`.
//!
//! It is pure (no I/O, no clock) and depends on `psych-types` only.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
