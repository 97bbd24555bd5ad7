//! `read_tool_output`: page and grep a stored tool result by handle, in process, over any
//! [`psych_types::RecordSource`].
//!
//! When a large tool result is shown to the model shortened, the model reads the rest back
//! with `read_tool_output(handle, offset, byte, limit, grep)`. The principal type is [`Reader`]: it
//! resolves the handle in its Run's source, then scans the stored result in bounded chunks,
//! so a small read of a huge result never pulls the whole result into memory. It needs no
//! sandbox and never shells out.
//!
//! Its edges are defined:
//!
//! - A handle that does not parse, names another Run, names no record, or names a record
//!   that is not a tool result is the `invalid_deferred_handle` corruption error
//!   ([`CallError::InvalidDeferredHandle`]): an error value for the caller, not a tool
//!   result. Another Run's handle is refused before the source is asked.
//! - Malformed arguments are [`Answer::Invalid`]: a validation error the model sees as its
//!   tool result and can correct.
//! - Units are lines, split on `\n` like `readlines`. `offset` counts lines to skip (0-based;
//!   lines are shown numbered from 1, so line `N` is at offset `N - 1`). An offset past the
//!   end, or a `grep` with no match, is an empty page, not an error. Every page says the
//!   result's size in bytes and (when known) lines, the range returned, and whether more
//!   follows with the offset to pass next.
//! - `grep` is a literal substring search (`memchr::memmem`) returning matching lines with
//!   their numbers, bounded by `limit`.
//! - Lines longer than [`Limits::max_line_bytes`] are cut and the cut is marked with the
//!   bytes left out (around the match with `grep`) and, at a line's end, the `offset` and
//!   `byte` that read on from the cut: `byte` skips that many bytes of the line at
//!   `offset` (with `grep`, matches wholly before it). A page closes once it shows
//!   [`Limits::max_page_bytes`].
//! - What is read is the result's readable text
//!   ([`ToolOutput::readable_text`](psych_types::ToolOutput::readable_text)): its text blocks,
//!   and one placeholder line for each image, audio, resource or unknown block naming its
//!   kind, MIME type, size and position, so binary data is described, never shown or
//!   searched as text. Bytes that are not UTF-8 (from a source other than psych's) are
//!   written `\xNN`, with backslashes doubled on that page and a note saying so: the page
//!   decodes back to the exact bytes, and reading on from each cut of a line shows every
//!   byte of it once, in order.
//!
//! The crate also gives the tool's [`tool_definition`] for the prompt, and
//! [`Answer::render`] turns an answer into the exact text the model sees.
//!
//! # What blocks
//!
//! [`Reader::call`] reads its source on the calling thread, as much as the read needs: a
//! page reads from the source's mark for its first line
//! ([`RecordSource::line_mark`](psych_types::RecordSource::line_mark): the result's start,
//! or a nearby point of a line index such as the record log keeps) to one chunk past its
//! last line, and a `grep` with few or no matches scans the rest of the result, 256 MiB
//! for the largest measured (`cargo bench -p psych-reader-tool`), each read a positional
//! file read for a record log.
//! From an async runtime, call it from `tokio::task::spawn_blocking` (or a thread of its
//! own), never from a task directly.
//!
//! # Errors and configuration
//!
//! A [`CallError`] is for the caller, never the model: the handle problem
//! (`invalid_deferred_handle`), the source's own error, or a source serving less than it
//! announced; its [`code`](CallError::code) is stable. What the model got wrong is an
//! [`Answer::Invalid`] instead. The bounds are [`Limits`], built by [`Limits::builder`]
//! (defaults: 200 lines a page, at most 1,000, lines cut at 2,000 bytes, pages closed at
//! 64 KiB), checked when built.
//!
//! # Example
//!
//! ```
//! use psych_reader_tool::{Answer, CallError, Reader};
//! use psych_types::{MemoryRecords, Record, RunId, ToolCallId, ToolOutput, ToolResult};
//! use serde_json::json;
//!
//! let mut log = MemoryRecords::new(RunId::new("run-7")?);
//! let handle = log.push(Record::ToolResult(ToolResult {
//!     target: None,
//!     call_id: ToolCallId::new("call_1")?,
//!     name: "fetch_logs".into(),
//!     output: ToolOutput::text("boot ok\ndisk ok\nERROR fan stopped\nshutdown\n"),
//! }));
//! let reader = Reader::new(&log);
//!
//! let answer = reader.call(&json!({"handle": handle.to_string(), "grep": "ERROR"}))?;
//! let Answer::Page(page) = &answer else { panic!("text reads as a page") };
//! assert_eq!(page.lines[0].number, 3);
//! assert!(answer.render().ends_with("     3\tERROR fan stopped"));
//!
//! // A handle of another Run is a typed corruption error, not a tool result.
//! let foreign = reader.call(&json!({"handle": "run-8:0"})).unwrap_err();
//! assert_eq!(foreign.code(), "invalid_deferred_handle");
//! assert!(matches!(foreign, CallError::InvalidDeferredHandle(_)));
//!
//! // Malformed arguments are for the model to fix.
//! let invalid = reader.call(&json!({"handle": handle.to_string(), "limit": 0}))?;
//! assert!(invalid.is_error());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod answer;
mod args;
mod definition;
mod error;
mod limits;
pub mod passing;
mod reader;
mod scan;

pub use answer::{Answer, Line, Page, ResultInfo};
pub use args::{ArgsError, ReadArgs};
pub use definition::tool_definition;
pub use error::{CallError, HandleProblem, InvalidHandle};
pub use limits::{DEFAULT_MAX_PASSED_BYTES, Limits, LimitsBuilder, LimitsError, MAX_GREP_BYTES};
pub use passing::{RESULT_KEY, ResultReference};
pub use reader::{Reader, read_tool_output};
