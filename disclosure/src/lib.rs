//! Tool disclosure: which tools a turn exposes to the model, and in what shape.
//!
//! Not built yet. This crate will own narrowing by the permission grant, the three-valued
//! preload flag, the tiers by permitted catalogue size (direct tools, a facade per server, a
//! search+call pair), the one-line deferred-server entries, the meta tools that list, describe
//! and call a deferred server's tools by `(server, tool)` pair, the call-time membership
//! re-check, argument validation against input schemas, and the orientation payload.
//!
//! It is pure (no I/O, no clock) and depends on `psych-types` only.

#![deny(missing_docs)]
#![forbid(unsafe_code)]
