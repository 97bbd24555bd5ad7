//! Elision: what the model sees of large and failed tool results.
//!
//! The principal type is [`Elider`], the workspace's
//! [`ResultProjector`](psych_types::ResultProjector): given one turn's tool results it sizes
//! each through the [`TokenEstimator`](psych_types::TokenEstimator) seam (the cheap
//! [`Estimator`] unless [`EliderBuilder::estimator`] names another), runs the spec's batch [`plan`] against two
//! [`Thresholds`] (per result and per batch, validated when built), and replaces each elided
//! success with a head+tail preview plus guidance naming `read_tool_output` and the
//! result's handle, and each failure with its first few hundred characters. Prompt
//! assembly calls it through the trait, without depending on this crate. A preview's head
//! ends at a line break and its tail starts after one (within [`LINE_SLACK`]), and its
//! marker names the omitted lines and the `read_tool_output` offset (and byte, when the
//! head ends within a line) that reads on.
//!
//! [`ResultProjector::project_stored`](psych_types::ResultProjector::project_stored) gives
//! the same bytes from a stored history: the estimate stored at append time, and only the
//! few kilobytes of head and tail a preview shows, read through the store, so projecting
//! a 256 MiB result costs what projecting a 2 KB one does.
//!
//! The [`Estimator`] is a trigger, not a meter: fast, monotone under appending and prepending
//! (text added at either end never lowers the estimate; it is not monotone in length, as no
//! tokenizer is: `0123456789` is 3 tokens, `abcdefghijkl` 1), close to a real
//! tokenizer (o200k_base) on tool-result content in every script, measured on text it was
//! not fitted to, and **never to be used for cost**.
//!
//! This crate is pure: no I/O, no clock, no globals of its own (the estimator reads
//! `fearless_simd`'s once-detected processor level, which changes its speed, never its
//! sums). The record log keeps every result in
//! full; this is only a projection.
//!
//! # What blocks
//!
//! Nothing of this crate's own: estimating, planning and
//! [`project`](psych_types::ResultProjector::project) are CPU work over memory, linear in
//! the bytes estimated (the crate's bench measures the estimator's speed).
//! [`project_stored`](psych_types::ResultProjector::project_stored) reads through the
//! [`OutputAccess`](psych_types::OutputAccess) it is given, so it blocks as that store does
//! (the record log reads its file: a preview's head and tail for an elided result, and the
//! stored shapes of its blocks other than text when it has some; the whole result only when
//! it has no stored estimate): from async code, call it
//! (or prompt-assembly's `StepHistory::load`, which calls it) off the async threads.
//!
//! # Errors
//!
//! - [`ThresholdsError`]: thresholds refused when they are built (zero, or a per-result
//!   threshold over the per-batch one), never when they are used.
//! - [`SourceError`](psych_types::SourceError), from `project_stored` only: the store could
//!   not read a result the view needs, or its readable text is not UTF-8.
//!
//! Projection itself cannot fail: every batch has a view.
//!
//! # Configuration
//!
//! [`Elider::builder`]: [`Thresholds`] (built and checked by [`Thresholds::builder`], or
//! deserialized, which runs the same checks), [`PreviewConfig`] (characters of head, tail
//! and failure kept), and [`EliderBuilder::estimator`] to size results with another
//! [`TokenEstimator`](psych_types::TokenEstimator). [`Elider::default`] is the default
//! thresholds and preview sizes with our [`Estimator`].
//!
//! # Example
//!
//! ```
//! use psych_elision::{Elider, PreviewConfig, Thresholds};
//! use psych_types::{Projection, RecordHandle, ResultProjector, ResultRef, RunId, ToolOutput};
//!
//! let thresholds = Thresholds::builder().per_result(2_000).per_batch(5_000).build()?;
//! let elider = Elider::builder()
//!     .thresholds(thresholds)
//!     .preview(PreviewConfig::builder().head_chars(40).tail_chars(20).build())
//!     .build();
//!
//! let run = RunId::new("run-7")?;
//! let (small, large) = (RecordHandle::new(run.clone(), 3), RecordHandle::new(run, 5));
//! let (fine, huge) = (ToolOutput::text("ok"), ToolOutput::text("log line\n".repeat(5_000)));
//! let batch = [
//!     ResultRef { handle: &small, output: &fine, target: None },
//!     ResultRef { handle: &large, output: &huge, target: None },
//! ];
//! let out = elider.project(&batch);
//!
//! assert_eq!(out[0], Projection::Full);
//! let Projection::Replaced(preview) = &out[1] else { return Err("not elided".into()) };
//! assert!(preview.starts_with("log line\n"));
//! assert!(preview.contains("read_tool_output with handle \"run-7:5\""));
//!
//! // Thresholds are checked when built, never at run time.
//! assert!(Thresholds::builder().per_result(10).per_batch(5).build().is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod elider;
mod estimate;
mod plan;
mod preview;
mod thresholds;

pub use elider::{Elider, EliderBuilder, MAX_LISTED_PLACEHOLDERS, placeholders_not_shown};
pub use estimate::Estimator;
pub use plan::{Plan, plan, plan_each};
pub use preview::{LINE_SLACK, PreviewConfig, PreviewConfigBuilder};
pub use thresholds::{Thresholds, ThresholdsBuilder, ThresholdsError};
